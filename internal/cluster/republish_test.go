package cluster

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// flipper is a node's local service holding one sandbox that the test
// wakes (and sleeps again) at a chosen read of its sleep image: the
// moment a record write may be computed from a view the sandbox left.
type flipper struct {
	service.Service
	mu    sync.Mutex
	state string // of sandbox "sbr"
	image string // digest of its sleep image's copy, "" while none is sealed
	reads int    // SleepImage calls
	// at, when reads reaches it, runs (without mu) after the read that
	// returned the image.
	at    int
	event func()
	// onWake, when set, runs at the start of Wake; wakeErr fails it.
	onWake  func()
	wakeErr error
}

func (f *flipper) Running(string) bool { return false }

func (f *flipper) Get(_ context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id != "sbr" {
		return api.Sandbox{}, errdefs.New(errdefs.NotFound, "no sandbox %s", id)
	}
	return api.Sandbox{ID: id, State: f.state, Image: "default", MemoryMiB: 256}, nil
}

func (f *flipper) SleepImage(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	f.reads++
	d, n, ev := f.image, f.reads, f.event
	f.mu.Unlock()
	if n == f.at && ev != nil {
		defer ev()
	}
	if d == "" {
		return "", errdefs.New(errdefs.NotFound, "%s has no copy in the snapshot store", id)
	}
	return d, nil
}

var _ service.Mover = (*flipper)(nil)

func (f *flipper) Adopt(context.Context, string, string, func(context.Context, string) (io.ReadCloser, error)) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.New(errdefs.Conflict, "the test adopts nothing")
}

func (f *flipper) Disown(context.Context, string) error {
	return errdefs.New(errdefs.Conflict, "the test disowns nothing")
}

func (f *flipper) set(state, image string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.image = state, image
}

// TestRepublishCopiedRace: the pass that writes a sleeping sandbox's
// record again once its image's copy is sealed (republishCopied, run at
// once by Copies.OnCopied) reads the sandbox, then its image, then
// writes. A wake on the node (its record written running by the wake's
// own call), or a wake and a sleep again (the new image's copy not sealed
// yet), at any point between those reads and the write must not leave the
// record naming the old image, nor asleep while the sandbox runs: another
// node would wake that image (wake --node) and the node running it would
// be fenced, its work since the wake lost.
func TestRepublishCopiedRace(t *testing.T) {
	cli := startEtcd(t)
	a := join(t, cli, "a", "")
	defer a.Close()
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for _, tc := range []struct {
		name       string
		sleepAgain bool
	}{{"wake", false}, {"wake+sleep", true}} {
		for at := 1; at <= 3; at++ {
			t.Run(fmt.Sprintf("%s/after-read-%d", tc.name, at), func(t *testing.T) {
				ctx := t.Context()
				l := &flipper{state: "sleeping"}
				s := NewService(a, l)
				// Asleep, its copy not sealed: the record names no image.
				if err := s.publish(ctx, api.Sandbox{ID: "sbr", State: "sleeping", Image: "default", MemoryMiB: 256}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = a.Unpublish(context.Background(), "sbr", true) })
				l.set("sleeping", d1) // sealed: OnCopied
				l.mu.Lock()
				l.reads, l.at = 0, at
				l.mu.Unlock()
				wrote := make(chan struct{})
				l.event = func() {
					// The wake: its copy dropped, its record written
					// running by the wake's call (service.wake), on
					// the call's goroutine: it may wait for the pass.
					l.set("running", "")
					go func() {
						defer close(wrote)
						if err := s.publish(ctx, api.Sandbox{ID: "sbr", State: "running", Image: "default", MemoryMiB: 256}); err != nil {
							t.Error(err)
						}
					}()
					if tc.sleepAgain {
						// Asleep again, its new copy being made; the
						// slept event's write comes after this pass
						// (the same loop).
						l.set("sleeping", "")
					}
				}
				s.moves.republishCopied(ctx)
				l.mu.Lock()
				reads := l.reads
				l.mu.Unlock()
				if reads >= at {
					<-wrote
				}
				rec, ok, err := a.Lookup(ctx, "sbr")
				if err != nil || !ok {
					t.Fatalf("lookup: %+v %v %v", rec, ok, err)
				}
				if reads < at {
					// The pass read the image fewer times than this case
					// wakes it after: the wake came after the pass.
					if rec.State != "sleeping" || rec.SleepImage != d1 {
						t.Fatalf("after a pass with no wake during it, the record is %s with image %q: want sleeping naming %.15s", rec.State, rec.SleepImage, d1)
					}
					return
				}
				if rec.SleepImage == d1 {
					t.Fatalf("the record names the image %.15s of a sleep the sandbox woke from (state %s): another node would wake that image", d1, rec.State)
				}
				if rec.State != "running" && !tc.sleepAgain {
					t.Fatalf("the record says %s over the woken sandbox's write: want running", rec.State)
				}
			})
		}
	}
}

func (f *flipper) Wake(ctx context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	on := f.onWake
	f.mu.Unlock()
	if on != nil {
		on()
	}
	if f.wakeErr != nil {
		return api.Sandbox{}, f.wakeErr
	}
	f.set("running", "")
	return f.Get(ctx, id)
}

// TestWakeHoldsRecord: while a node wakes one of its sleeping sandboxes,
// the record names no image (no other node may take it: a wake --node
// there would reassign it and wake its image while this node runs it,
// and this node, fenced, would then remove the running sandbox after
// answering its wake), whatever this node writes meanwhile (its pass
// for a copy just sealed, an event's write); the wake's write ends it
// running, and a failed wake gives the record its image back.
func TestWakeHoldsRecord(t *testing.T) {
	cli := startEtcd(t)
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	ctx := t.Context()
	l := &flipper{state: "sleeping", image: d1}
	sa := NewService(a, l)
	asleep := api.Sandbox{ID: "sbr", State: "sleeping", Image: "default", MemoryMiB: 256}
	if err := sa.publish(ctx, asleep); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := b.Lookup(ctx, "sbr"); !movable(rec) {
		t.Fatalf("before the wake: %+v, want movable", rec)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	l.onWake = func() {
		close(entered)
		<-release
	}
	woke := make(chan error, 1)
	go func() {
		_, err := sa.Wake(ctx, "sbr")
		woke <- err
	}()
	select {
	case <-entered:
	case err := <-woke:
		t.Fatalf("the wake returned before the node woke it: %v", err)
	}
	check := func(when string) {
		rec, ok, err := b.Lookup(ctx, "sbr")
		if err != nil || !ok {
			t.Fatalf("%s: %+v %v %v", when, rec, ok, err)
		}
		if movable(rec) {
			close(release)
			t.Fatalf("%s: the record is %s naming %.15s on %s: another node may take it while %s wakes it", when, rec.State, rec.SleepImage, rec.Node, rec.Node)
		}
	}
	check("during the wake")
	// The node's own writes meanwhile (an event's, or the pass for a
	// copy sealed now) keep it so.
	if err := sa.publish(ctx, asleep); err != nil {
		t.Fatal(err)
	}
	sa.moves.awaitCopy("sbr")
	sa.moves.republishCopied(ctx)
	check("after the node's writes during the wake")
	close(release)
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := b.Lookup(ctx, "sbr"); rec.State != "running" || rec.SleepImage != "" {
		t.Fatalf("after the wake: %+v, want running", rec)
	}
	// Asleep again (image D2); a wake that fails leaves it asleep here,
	// its record naming D2 again.
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	l.set("sleeping", d2)
	if err := sa.publish(ctx, asleep); err != nil {
		t.Fatal(err)
	}
	l.onWake, l.wakeErr = nil, errdefs.New(errdefs.ResourceExhausted, "no room")
	if _, err := sa.Wake(ctx, "sbr"); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("the failed wake: %v", err)
	}
	if rec, _, _ := b.Lookup(ctx, "sbr"); !movable(rec) || rec.SleepImage != d2 || rec.Node != "a" {
		t.Fatalf("after a failed wake: %+v, want asleep on a naming %.15s", rec, d2)
	}
}
