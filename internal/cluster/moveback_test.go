package cluster

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// sleeper is a node's local service holding sleeping sandboxes, each with
// the digest of its sleep image's copy: enough of service.Service and
// service.Mover for route's view of a move.
type sleeper struct {
	service.Service
	mu      sync.Mutex
	images  map[string]string // id -> digest of its local sleep image
	disowns []string
	adopts  []string
	// onAdopt runs in Adopt, before the sandbox is recorded: the node's
	// events (its disown's removed) are handled meanwhile.
	onAdopt func()
	// onRemove runs in Remove, before the sandbox goes.
	onRemove func()
	removes  []string
}

func (f *sleeper) Running(string) bool { return false }

func (f *sleeper) Get(_ context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[id]; !ok {
		return api.Sandbox{}, errdefs.New(errdefs.NotFound, "no sandbox %s", id)
	}
	return api.Sandbox{ID: id, State: "sleeping", Image: "default", MemoryMiB: 256}, nil
}

func (f *sleeper) SleepImage(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.images[id]
	if !ok {
		return "", errdefs.New(errdefs.NotFound, "no sandbox %s", id)
	}
	return d, nil
}

// A Mover: an Adopt of another signature would make it none (the node
// then "cannot adopt sandboxes").
var _ service.Mover = (*sleeper)(nil)

func (f *sleeper) Adopt(_ context.Context, id, digest string, _ func(context.Context, string) (io.ReadCloser, error)) (api.Sandbox, error) {
	if f.onAdopt != nil {
		f.onAdopt()
	}
	f.mu.Lock()
	if _, ok := f.images[id]; !ok {
		f.images[id] = digest
		f.adopts = append(f.adopts, digest)
	}
	f.mu.Unlock()
	return f.Get(context.Background(), id)
}

func (f *sleeper) Disown(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[id]; !ok {
		return errdefs.New(errdefs.NotFound, "no sandbox %s", id)
	}
	delete(f.images, id)
	f.disowns = append(f.disowns, id)
	return nil
}

// TestMovedBackStale: a sandbox slept on a (image D1), given to b (a
// drained), adopted, woken and slept again there (image D2), then given
// back to a (b drained) before a's full pass removed its copy. a's copy
// is stale: a call through a must not wake it (the work done on b would
// be lost, and a's write of the record, fenced, would remove the
// sandbox): a drops its copy and adopts D2.
func TestMovedBackStale(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(map[bool]string{false: "call", true: "pass"}[stale], func(t *testing.T) { movedBackStale(t, stale) })
	}
}

func movedBackStale(t *testing.T, stale bool) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	la := &sleeper{images: map[string]string{"sbx": d1}}
	sa := NewService(a, la)
	sb := api.Sandbox{ID: "sbx", State: "sleeping", Image: "default", MemoryMiB: 256}
	if err := a.PublishImage(ctx, sb, d1); err != nil {
		t.Fatal(err)
	}
	// a drained: given to b, which adopts it, wakes it, sleeps it (D2).
	rec, rev, _, _, _ := b.lookupRev(ctx, "sbx")
	rec, err := b.Reassign(ctx, rec, rev, "b", false)
	if err != nil {
		t.Fatal(err)
	}
	_, rev, _, _, _ = b.lookupRev(ctx, "sbx")
	if _, err := b.claim(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	if err := b.PublishImage(ctx, sb, d2); err != nil {
		t.Fatal(err)
	}
	b.dropClaim(ctx, "sbx")
	// b drained: given back to a.
	rec, rev, _, _, _ = a.lookupRev(ctx, "sbx")
	if rec.SleepImage != d2 || rec.Node != "b" {
		t.Fatalf("b's record: %+v", rec)
	}
	if _, err := a.Reassign(ctx, rec, rev, "a", false); err != nil {
		t.Fatal(err)
	}
	if stale {
		// a's full pass (or an event) writes its copy: fenced, the copy
		// goes; the removed event's drop of the record leaves it, to be
		// adopted.
		if err := sa.publish(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := a.Unpublish(ctx, "sbx", false); err != nil {
			t.Fatal(err)
		}
		if r, ok, _ := a.Lookup(ctx, "sbx"); !ok || r.SleepImage != d2 || r.Node != "a" {
			t.Fatalf("the record after a dropped its stale copy: %+v %v (want it kept, naming a and %.15s)", r, ok, d2)
		}
	}
	// The removed event of a's dropped copy is handled while the adopt
	// fetches: the record, claimed, stays.
	la.onAdopt = func() {
		if err := a.Unpublish(ctx, "sbx", false); err != nil {
			t.Error(err)
		}
	}
	// A call through a.
	svc, err := sa.route(ctx, "sbx")
	if err != nil {
		t.Fatal(err)
	}
	if svc != service.Service(sa.Service) {
		t.Fatalf("routed to %T, want a's own", svc)
	}
	la.mu.Lock()
	got, disowns, adopts := la.images["sbx"], la.disowns, la.adopts
	la.mu.Unlock()
	if got != d2 || len(disowns) != 1 || len(adopts) != 1 {
		t.Fatalf("a holds image %.15s (disowned %v, adopted %v): want its stale copy of %.15s dropped and %.15s adopted", got, disowns, adopts, d1, d2)
	}
	if r, _, _ := a.Lookup(ctx, "sbx"); r.Epoch != 3 || r.Node != "a" || r.State != "sleeping" || r.SleepImage != d2 {
		t.Fatalf("the adopted record: %+v (want sleeping on a at epoch 3, image %.15s)", r, d2)
	}
	// Its write of the record now is not fenced.
	if err := sa.publish(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, ok := la.images["sbx"]; !ok {
		t.Fatal("a removed the sandbox it adopted")
	}
}

// TestGivenBackSame: a sandbox given away from a and back before any
// node adopted it (its image the same) wakes on a from a's copy, and a's
// later writes are not fenced (which would remove it).
func TestGivenBackSame(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	la := &sleeper{images: map[string]string{"sbx": d1}}
	sa := NewService(a, la)
	sb := api.Sandbox{ID: "sbx", State: "sleeping", Image: "default", MemoryMiB: 256}
	if err := a.PublishImage(ctx, sb, d1); err != nil {
		t.Fatal(err)
	}
	rec, rev, _, _, _ := b.lookupRev(ctx, "sbx")
	if _, err := b.Reassign(ctx, rec, rev, "b", false); err != nil {
		t.Fatal(err)
	}
	rec, rev, _, _, _ = b.lookupRev(ctx, "sbx")
	if _, err := b.Reassign(ctx, rec, rev, "a", false); err != nil {
		t.Fatal(err)
	}
	if _, err := sa.route(ctx, "sbx"); err != nil {
		t.Fatal(err)
	}
	if err := sa.publish(ctx, api.Sandbox{ID: "sbx", State: "running", Image: "default", MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
	la.mu.Lock()
	defer la.mu.Unlock()
	if la.images["sbx"] != d1 || len(la.disowns) != 0 || len(la.adopts) != 0 {
		t.Fatalf("a's copy: %v, disowned %v, adopted %v (want kept as it is)", la.images, la.disowns, la.adopts)
	}
}

func (f *sleeper) Remove(_ context.Context, id string) error {
	if f.onRemove != nil {
		f.onRemove()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[id]; !ok {
		return errdefs.New(errdefs.NotFound, "no sandbox %s", id)
	}
	delete(f.images, id) // and its copy in the store: Drop
	f.removes = append(f.removes, id)
	return nil
}

// TestRemoveRacesDrain: a remove of a sleeping sandbox on its node while
// a drain gives it to another node must not leave the record given away,
// naming the image the remove dropped from the store (a sandbox the user
// removed, listed on the other node, that no call can wake).
func TestRemoveRacesDrain(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	la := &sleeper{images: map[string]string{"sbx": d1}}
	sa := NewService(a, la)
	if err := a.PublishImage(ctx, api.Sandbox{ID: "sbx", State: "sleeping", Image: "default", MemoryMiB: 256}, d1); err != nil {
		t.Fatal(err)
	}
	la.onRemove = func() {
		// The drain of a, through b, as the remove runs.
		rec, rev, _, ok, err := b.lookupRev(ctx, "sbx")
		if !ok || err != nil {
			return // the record went first: nothing to give
		}
		if _, err := b.Reassign(ctx, rec, rev, "b", false); err != nil {
			t.Logf("drain: %v", err)
		}
	}
	err := sa.Remove(ctx, "sbx")
	if r, ok, _ := b.Lookup(ctx, "sbx"); ok {
		t.Fatalf("after the remove (%v) the record stays: %+v", err, r)
	}
	if err != nil {
		t.Fatal(err)
	}
}
