package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakePrep hands out ids and records what was destroyed.
type fakePrep struct {
	mu        sync.Mutex
	n         int
	fail      bool
	destroyed []string
	made      chan string
}

func (f *fakePrep) prepare(ctx context.Context, sh Shape) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", errors.New("no")
	}
	f.n++
	id := fmt.Sprintf("p%d-%s", f.n, sh.Image)
	select {
	case f.made <- id:
	default:
	}
	return id, nil
}

func (f *fakePrep) destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed = append(f.destroyed, id)
	return nil
}

func waitLen(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d, want %d", p.Len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRefillUpToTargetAndLimit(t *testing.T) {
	f := &fakePrep{made: make(chan string, 100)}
	p := New(Config{Limit: 3, Prepare: f.prepare, Destroy: f.destroy})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.Run(ctx)
	a := ShapeOf("a", 256, 1, nil, 0, "none")
	p.Want(a, 10) // capped at the limit
	waitLen(t, p, 3)
	id, ok := p.Take(a)
	if !ok || id == "" {
		t.Fatal("take from a filled pool failed")
	}
	if _, ok := p.Take(ShapeOf("b", 256, 1, nil, 0, "none")); ok {
		t.Fatal("took a sandbox of a shape never prepared")
	}
	p.Want(a, 0) // refill what was taken
	waitLen(t, p, 3)
	p.Drain(t.Context())
	if p.Len() != 0 || len(f.destroyed) != 3 {
		t.Fatalf("after drain: %d left, %d destroyed", p.Len(), len(f.destroyed))
	}
}

func TestWantZeroDoesNotCreateATarget(t *testing.T) {
	f := &fakePrep{made: make(chan string, 1)}
	p := New(Config{Limit: 3, Prepare: f.prepare})
	p.Want(ShapeOf("x", 1, 1, nil, 0, ""), 0)
	if _, ok, _ := p.missing(); ok {
		t.Fatal("Want(sh, 0) asked for sandboxes of a shape nobody wanted")
	}
}

func TestZeroLimitIsOff(t *testing.T) {
	f := &fakePrep{}
	p := New(Config{Limit: 0, Prepare: f.prepare})
	p.Want(ShapeOf("x", 1, 1, nil, 0, ""), 5)
	p.Run(t.Context()) // returns at once
	if p.Len() != 0 || f.n != 0 {
		t.Fatal("a pool with limit 0 prepared sandboxes")
	}
}

func TestShapesDiffer(t *testing.T) {
	base := ShapeOf("img", 512, 1, []string{"A=1"}, 0, "internet")
	for name, other := range map[string]Shape{
		"memory":  ShapeOf("img", 256, 1, []string{"A=1"}, 0, "internet"),
		"env":     ShapeOf("img", 512, 1, []string{"A=2"}, 0, "internet"),
		"network": ShapeOf("img", 512, 1, []string{"A=1"}, 0, "none"),
		"disk":    ShapeOf("img", 512, 1, []string{"A=1"}, 64, "internet"),
	} {
		if other == base {
			t.Errorf("%s: shapes that differ compare equal", name)
		}
	}
	if got := base.EnvList(); len(got) != 1 || got[0] != "A=1" {
		t.Errorf("EnvList = %q", got)
	}
}

func TestAFailingShapeDoesNotHoldUpOthers(t *testing.T) {
	f := &fakePrep{made: make(chan string, 100)}
	prepare := func(ctx context.Context, sh Shape) (string, error) {
		if sh.Image == "broken" {
			return "", errors.New("no such image")
		}
		return f.prepare(ctx, sh)
	}
	p := New(Config{Limit: 2, Prepare: prepare, RetryAfter: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.Run(ctx)
	p.Want(ShapeOf("broken", 1, 1, nil, 0, ""), 2)
	p.Want(ShapeOf("good", 1, 1, nil, 0, ""), 2)
	waitLen(t, p, 2)
}

func TestPrepareFinishingAfterDrainIsDestroyed(t *testing.T) {
	f := &fakePrep{made: make(chan string, 1)}
	release := make(chan struct{})
	started := make(chan struct{})
	prepare := func(ctx context.Context, sh Shape) (string, error) {
		close(started)
		<-release
		return f.prepare(ctx, sh)
	}
	p := New(Config{Limit: 1, Prepare: prepare, Destroy: f.destroy})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	p.Want(ShapeOf("a", 1, 1, nil, 0, ""), 1)
	<-started
	cancel()
	p.Drain(t.Context())
	close(release)
	<-done
	if p.Len() != 0 || len(f.destroyed) != 1 {
		t.Fatalf("a prepare that finished after Drain: %d kept, %d destroyed", p.Len(), len(f.destroyed))
	}
}
