package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

func TestDrainWaitsForAPrepareUnderWay(t *testing.T) {
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
	drained := make(chan struct{})
	go func() { p.Drain(t.Context()); close(drained) }()
	select {
	case <-drained:
		t.Fatal("Drain returned while a prepare was under way: a daemon exiting now leaves its sandbox behind")
	case <-time.After(50 * time.Millisecond): // Drain must still be waiting
	}
	close(release)
	<-drained
	f.mu.Lock()
	destroyed := len(f.destroyed)
	f.mu.Unlock()
	if p.Len() != 0 || destroyed != 1 {
		t.Fatalf("a prepare that finished during Drain: %d kept, %d destroyed by the time Drain returned", p.Len(), destroyed)
	}
	<-done
}

func TestDrainWaitsOnlyUntilItsContextEnds(t *testing.T) {
	f := &fakePrep{made: make(chan string, 1)}
	release := make(chan struct{})
	started := make(chan struct{})
	prepare := func(ctx context.Context, sh Shape) (string, error) {
		close(started)
		<-release
		return f.prepare(ctx, sh)
	}
	p := New(Config{Limit: 1, Prepare: prepare, Destroy: f.destroy})
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(runCtx); close(done) }()
	p.Want(ShapeOf("a", 1, 1, nil, 0, ""), 1)
	<-started
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	p.Drain(ctx) // returns once ctx ends, the prepare still under way
	close(release)
	stop()
	<-done // Run returns only after the prepare it was in
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.Len() != 0 || len(f.destroyed) != 1 {
		t.Fatalf("a prepare that finished after Drain gave up: %d kept, %d destroyed", p.Len(), len(f.destroyed))
	}
}

func TestSecondMissLearnsTheShape(t *testing.T) {
	f := &fakePrep{made: make(chan string, 10)}
	p := New(Config{Limit: 3, Prepare: f.prepare, Destroy: f.destroy})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.Run(ctx)
	b := ShapeOf("b", 256, 1, nil, 0, "none")
	if _, ok := p.Take(b); ok {
		t.Fatal("took from an empty pool")
	}
	if _, ok, _ := p.missing(); ok {
		t.Fatal("one miss made the pool keep a shape")
	}
	if _, ok := p.Take(b); ok {
		t.Fatal("took from an empty pool")
	}
	p.Want(b, 0) // what a create does after its take
	waitLen(t, p, 1)
	if _, ok := p.Take(b); !ok {
		t.Fatal("the second miss did not make the pool keep the shape")
	}
	if h, m := p.Stats(); h != 1 || m != 2 {
		t.Fatalf("stats: %d hits %d misses, want 1 and 2", h, m)
	}
}

func TestTotalCapEvictsTheLeastRecentlyAskedShape(t *testing.T) {
	f := &fakePrep{made: make(chan string, 10)}
	p := New(Config{Limit: 2, MaxTotal: 3, Prepare: f.prepare, Destroy: f.destroy})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.Run(ctx)
	a, b, c := ShapeOf("a", 1, 1, nil, 0, ""), ShapeOf("b", 1, 1, nil, 0, ""), ShapeOf("c", 1, 1, nil, 0, "")
	p.Pin(a, 2)
	p.Want(b, 1)
	waitLen(t, p, 3)
	p.Want(c, 1) // 4 > 3: b, asked for before c and not pinned, gives way
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		got := [3]int{len(p.slots[a]), len(p.slots[b]), len(p.slots[c])}
		p.mu.Unlock()
		if got == [3]int{2, 0, 1} {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prepared per shape a, b, c: %v, want [2 0 1]", got)
		}
		time.Sleep(time.Millisecond) // polling the refill loop
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.destroyed) != 1 || !strings.HasSuffix(f.destroyed[0], "-b") {
		t.Fatalf("destroyed %v, want b's one prepared sandbox", f.destroyed)
	}
}

func TestShapesNobodyAskedForExpire(t *testing.T) {
	f := &fakePrep{made: make(chan string, 10)}
	p := New(Config{Limit: 2, Expire: 50 * time.Millisecond, Prepare: f.prepare, Destroy: f.destroy})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.Run(ctx)
	a, b := ShapeOf("a", 1, 1, nil, 0, ""), ShapeOf("b", 1, 1, nil, 0, "")
	p.Pin(a, 1)
	p.Want(b, 1)
	waitLen(t, p, 2)
	waitLen(t, p, 1) // b expires; the pinned a stays
	if _, ok := p.Take(a); !ok {
		t.Fatal("the pinned shape expired")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.destroyed) != 1 || !strings.HasSuffix(f.destroyed[0], "-b") {
		t.Fatalf("destroyed %v, want b's prepared sandbox", f.destroyed)
	}
}

// TestMissesHoldNoLargeEnvironments: a miss remembers its shape; shapes
// carry the environment (up to 256 KiB), so maxMissed misses of distinct
// environments (cheap: a create with a taken name records its miss and
// fails) held up to 256 MiB of heap until the map was cleared.
func TestMissesHoldNoLargeEnvironments(t *testing.T) {
	p := New(Config{Limit: 1})
	big := "K=" + strings.Repeat("x", 256<<10)
	for i := range 8 {
		p.Take(ShapeOf("img", 512, 1, []string{fmt.Sprint(i) + big}, 0, ""))
	}
	held := 0
	p.mu.Lock()
	for sh := range p.missed {
		held += len(sh.Env)
	}
	p.mu.Unlock()
	if held > 8<<10 {
		t.Fatalf("8 misses hold %d bytes of environment", held)
	}
	// The second miss of a long-environment shape still teaches it.
	sh := ShapeOf("img", 512, 1, []string{"0" + big}, 0, "")
	p.Take(sh)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target[sh] != 1 {
		t.Fatal("the second miss of a shape with a long environment did not target it")
	}
}
