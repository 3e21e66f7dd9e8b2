package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine/fake"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/clade-sandbox/clade/internal/store"
)

// copyImage copies the sealed image in src to dir (not existing), with
// corrupt applied to its data file's bytes: what a peer sends.
func copyImage(t *testing.T, src, dir string, corrupt func([]byte)) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() != stateimg.ManifestName {
			corrupt(b)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPorterImport exports a running sandbox's snapshot from one node and
// imports it on another (its own store, engine and snapshot dir, the same
// image): an image with a byte flipped in transit is refused by the
// verification and leaves nothing on the target; an intact one restores
// the children, whose implicit snapshot goes with the last of them; a
// node without the same image root refuses before fetching.
func TestPorterImport(t *testing.T) {
	a := newEnv(t, Config{})
	parent := a.create(t, 64)
	owner := NewPorter(a.m)
	if _, _, err := owner.Export(t.Context(), parent.ID, a.m.cfg.MaxFork+1); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("export for more children than --max-fork: %v", err)
	}
	e, release, err := owner.Export(t.Context(), parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if e.Local != "" || e.ImageID == "" || e.Digest == "" {
		t.Fatalf("export %+v", e)
	}
	src, done, err := owner.Open(e.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if _, _, err := owner.Open("sha256:00"); !errdefs.IsNotFound(err) {
		t.Fatalf("open of an image not being sent: %v", err)
	}

	dir := t.TempDir()
	stB, err := store.Open(t.Context(), filepath.Join(dir, "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer stB.Close()
	cfgB := Config{SnapshotDir: filepath.Join(dir, "snapshots"), SleepDir: filepath.Join(dir, "sleep"), MemoryFloorMiB: 1, PressureFloorMiB: -1}
	b := New(cfgB, fake.New(), stB, a.imgs)
	img, err := a.m.images.Get(t.Context(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.images.install(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	target := NewPorter(b)
	empty := func(what string) {
		t.Helper()
		if sns, _ := stB.ListSnapshots(t.Context()); len(sns) != 0 {
			t.Fatalf("%s: the target records snapshots %+v", what, sns)
		}
		if sbs, _ := stB.ListSandboxes(t.Context()); len(sbs) != 0 {
			t.Fatalf("%s: the target records sandboxes %+v", what, sbs)
		}
		if ents, _ := os.ReadDir(cfgB.SnapshotDir); len(ents) != 0 {
			t.Fatalf("%s: the target keeps %v in its snapshot dir", what, ents)
		}
	}

	fetched := 0
	_, err = target.Import(t.Context(), e, 2, func(ctx context.Context, dir string) error {
		fetched++
		copyImage(t, src, dir, func(b []byte) { b[len(b)/2] ^= 1 })
		return nil
	})
	if !errors.Is(err, stateimg.ErrCorrupt) || fetched != 1 {
		t.Fatalf("import of a corrupted image: %v (fetched %d), want corrupt", err, fetched)
	}
	t.Logf("corrupt: %v", err)
	empty("after a corrupt import")

	other := e
	other.ImageID = "sha256:00"
	if _, err := target.Import(t.Context(), other, 1, func(ctx context.Context, dir string) error {
		t.Fatal("fetched for a node without the image root")
		return nil
	}); !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("import on another image root: %v, want conflict", err)
	}

	// A peer's snapshot that names volumes or secrets would mount this
	// node's: refused before a fetch.
	for _, o := range []string{`{"volumes":[{"name":"v","path":"/data"}]}`, `{"secrets":[{"name":"s"}]}`} {
		smuggled := e
		smuggled.Opts = json.RawMessage(o)
		if _, err := target.Import(t.Context(), smuggled, 1, func(ctx context.Context, dir string) error {
			t.Fatal("fetched a snapshot with volumes or secrets")
			return nil
		}); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("import of %s: %v, want invalid", o, err)
		}
	}
	empty("after imports with volumes or secrets")

	res, err := target.Import(t.Context(), e, 2, func(ctx context.Context, dir string) error {
		copyImage(t, src, dir, func([]byte) {})
		return nil
	})
	if err != nil || len(res.Children) != 2 || res.Children[0].Err != nil || res.Children[1].Err != nil {
		t.Fatalf("import: %+v %v", res, err)
	}
	sn, err := stB.GetSnapshot(t.Context(), e.ID)
	if err != nil || !sn.Implicit || sn.State != store.SnapshotReady {
		t.Fatalf("imported snapshot %+v %v", sn, err)
	}
	for _, c := range res.Children {
		if err := b.Destroy(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
	empty("after the children are removed")
}

// TestExportedSnapshotKept: a named snapshot a fork across nodes is
// sending (exported, not yet released) is not removed under it: the rm
// is a Conflict that says why, and goes through once the fork is done.
func TestExportedSnapshotKept(t *testing.T) {
	a := newEnv(t, Config{})
	parent := a.create(t, 64)
	sn, err := a.m.Snapshot(t.Context(), parent.ID, "base", false)
	if err != nil {
		t.Fatal(err)
	}
	e, release, err := NewPorter(a.m).Export(t.Context(), "base", 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.m.DeleteSnapshot(t.Context(), "base"); !errdefs.Is(err, errdefs.Conflict) {
		release()
		t.Fatalf("rm of a snapshot being sent to other nodes: %v, want Conflict", err)
	}
	if dir, done, err := NewPorter(a.m).Open(e.Digest); err != nil {
		t.Fatalf("the image, after the refused rm: %v", err)
	} else if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the image's files, after the refused rm: %v", err)
	} else {
		done()
	}
	release()
	if err := a.m.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatalf("rm once the fork is done: %v", err)
	}
}
