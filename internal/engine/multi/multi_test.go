package multi_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/fake"
	"github.com/clade-sandbox/clade/internal/engine/multi"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// owner is a fake engine that claims checkpoint dirs named "*.vm".
type owner struct{ *fake.Engine }

func (o owner) IsCheckpoint(dir string) bool { return strings.HasSuffix(dir, ".vm") }

func (o owner) Holds(id string) bool {
	ids, _ := o.List(context.Background())
	return slices.Contains(ids, id)
}

// TestAttachFindsTheHolder: a record that names no engine, made while
// another engine was the default, is attached in the engine holding it
// (a daemon restarted with another --engine lost such sandboxes).
func TestAttachFindsTheHolder(t *testing.T) {
	a, b := fake.New(), owner{fake.New()}
	ctx := t.Context()
	before, err := multi.New("b", map[string]engine.Engine{"a": a, "b": b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := before.Create(ctx, engine.Spec{ID: "sb"}); err != nil {
		t.Fatal(err)
	}
	after, err := multi.New("a", map[string]engine.Engine{"a": a, "b": b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := after.Attach(ctx, engine.Spec{ID: "sb"}); err != nil {
		t.Fatalf("attach after the default changed: %v", err)
	}
	if _, err := after.Attach(ctx, engine.Spec{ID: "nobody"}); !errdefs.IsNotFound(err) {
		t.Fatalf("attach of an id no engine holds: %v, want the default engine's not found", err)
	}
}

func TestDispatch(t *testing.T) {
	a, b := fake.New(), owner{fake.New()}
	m, err := multi.New("a", map[string]engine.Engine{"a": a, "b": b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	has := func(e engine.Engine, id string) bool {
		ids, _ := e.List(ctx)
		return slices.Contains(ids, id)
	}
	tests := []struct {
		name, engine, id string
		inA, inB         bool
	}{
		{"default", "", "sb1", true, false},
		{"named default", "a", "sb2", true, false},
		{"other", "b", "sb3", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := m.Create(ctx, engine.Spec{ID: tc.id, Engine: tc.engine}); err != nil {
				t.Fatal(err)
			}
			if has(a, tc.id) != tc.inA || has(b, tc.id) != tc.inB {
				t.Fatalf("%s: in a %v, in b %v; want %v, %v", tc.id, has(a, tc.id), has(b, tc.id), tc.inA, tc.inB)
			}
		})
	}
	if _, err := m.Create(ctx, engine.Spec{ID: "x", Engine: "firecracker"}); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "a, b") {
		t.Fatalf("unknown engine: %v; want invalid-argument naming the engines", err)
	}
	// A checkpoint goes to the engine holding the id; its restore to the
	// engine that claims the directory, whatever the spec says.
	dir := filepath.Join(t.TempDir(), "snap.vm")
	if err := m.Checkpoint(ctx, "sb3", dir, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Restore(ctx, engine.Spec{ID: "kid"}, dir); err != nil {
		t.Fatal(err)
	}
	if !has(b, "kid") || has(a, "kid") {
		t.Fatal("the restored child is not in the engine that made the checkpoint")
	}
	// A sandbox prepared in one engine gives way to a create in another.
	if err := m.Prepare(ctx, engine.Spec{ID: "warm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, engine.Spec{ID: "warm", Engine: "b"}); err != nil {
		t.Fatal(err)
	}
	if has(a, "warm") || !has(b, "warm") {
		t.Fatal("a prepared sandbox of the default engine was not moved to the engine asked for")
	}
	ids, _ := m.List(ctx)
	if want := []string{"kid", "sb1", "sb2", "sb3", "warm"}; !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want %v", ids, want)
	}
	for _, id := range ids {
		if err := m.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if ids, _ := m.List(ctx); len(ids) != 0 {
		t.Fatalf("after destroying everything: %v", ids)
	}
}

// TestMissingEngineRefuses: an engine this host lacks is refused with its
// reason at every way in (create, prepare, attach, the restore of a
// checkpoint it wrote), never served by the default engine instead.
func TestMissingEngineRefuses(t *testing.T) {
	a := fake.New()
	why := errors.New("qemu-system-x86_64 not found: run `make deps-qemu`")
	m, err := multi.New("a", map[string]engine.Engine{"a": a},
		map[string]multi.Missing{"vm": {Why: why, IsCheckpoint: func(dir string) bool { return strings.HasSuffix(dir, ".vm") }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	refused := func(what string, err error, cls errdefs.Class) {
		t.Helper()
		if !errdefs.Is(err, cls) || !strings.Contains(err.Error(), "vm engine is not available") || !strings.Contains(err.Error(), "make deps-qemu") {
			t.Fatalf("%s: %v; want %s naming the missing part and its install command", what, err, cls)
		}
	}
	_, err = m.Create(ctx, engine.Spec{ID: "c", Engine: "vm"})
	refused("create", err, errdefs.InvalidArgument)
	refused("prepare", m.Prepare(ctx, engine.Spec{ID: "p", Engine: "vm"}), errdefs.InvalidArgument)
	_, err = m.Attach(ctx, engine.Spec{ID: "at", Engine: "vm"})
	refused("attach", err, errdefs.Unavailable)
	// A checkpoint of the missing engine, restored for a spec that names
	// no engine (a fork child of a record made when it was the default).
	_, err = m.Restore(ctx, engine.Spec{ID: "r"}, filepath.Join(t.TempDir(), "snap.vm"))
	refused("restore of its checkpoint", err, errdefs.Unavailable)
	_, err = m.Restore(ctx, engine.Spec{ID: "r2", Engine: "vm"}, t.TempDir())
	refused("restore for a spec naming it", err, errdefs.Unavailable)
	if ids, _ := a.List(ctx); len(ids) != 0 {
		t.Fatalf("the default engine ran %v in place of the missing one", ids)
	}
	st := m.Statuses()
	if len(st) != 2 || st[0] != (multi.Status{Name: "a", Default: true, Available: true}) ||
		st[1].Name != "vm" || st[1].Available || st[1].Why != why.Error() {
		t.Fatalf("statuses: %+v", st)
	}
}
