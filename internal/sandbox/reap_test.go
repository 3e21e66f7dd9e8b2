package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/store"
)

// orderHook records hook calls in order and can hold AfterStop.
type orderHook struct {
	mu     sync.Mutex
	events []string
	hold   chan struct{} // AfterStop waits on it while set
	held   chan struct{} // closed when an AfterStop is held
	seen   chan struct{} // closed at the first BeforeStart after held
}

func (h *orderHook) Name() string { return "order" }
func (h *orderHook) add(ev string) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
}
func (h *orderHook) BeforeStart(_ context.Context, rec store.Sandbox, _ *engine.Spec) error {
	h.add("start:" + rec.Engine())
	h.mu.Lock()
	if h.seen != nil {
		close(h.seen)
		h.seen = nil
	}
	h.mu.Unlock()
	return nil
}
func (h *orderHook) AfterStart(context.Context, store.Sandbox, engine.Sandbox) error { return nil }
func (h *orderHook) AfterStop(_ context.Context, rec store.Sandbox) error {
	h.mu.Lock()
	hold, held := h.hold, h.held
	h.hold, h.held = nil, nil
	h.mu.Unlock()
	if hold != nil {
		close(held)
		<-hold
	}
	h.add("stop:" + rec.Engine())
	return nil
}
func (h *orderHook) AfterRemove(context.Context, store.Sandbox) error { return nil }
func (h *orderHook) Reconcile(context.Context, []store.Sandbox, []store.Sandbox) error {
	return nil
}

// TestSleepAnswersBeforeItsTeardown: a sleep returns asleep, its engine
// sandbox stopped, while its hooks' teardown (the network slot) is still
// held; a wake into the same engine id waits for that teardown before its
// own hooks start, so a slot is never released after it was taken again.
func TestSleepAnswersBeforeItsTeardown(t *testing.T) {
	h := &orderHook{}
	e := newEnv(t, Config{Hooks: []Hook{h}})
	sb := e.create(t, 128)
	hold, held := make(chan struct{}), make(chan struct{})
	h.mu.Lock()
	h.hold, h.held = hold, held
	h.mu.Unlock()
	rec, err := e.m.Sleep(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateSleeping || e.state(t, sb.ID) != store.StateSleeping {
		t.Fatalf("sleep answered %s, recorded %s", rec.State, e.state(t, sb.ID))
	}
	if e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("the engine sandbox still runs after the sleep answered")
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the sleep's teardown never ran")
	}
	seen := make(chan struct{})
	h.mu.Lock()
	h.seen = seen
	h.mu.Unlock()
	woke := make(chan error, 1)
	go func() {
		_, err := e.m.Wake(context.Background(), sb.ID)
		woke <- err
	}()
	// A wake that did not wait would start its hooks now; give it time to,
	// then let the teardown finish.
	select {
	case <-seen:
	case <-time.After(300 * time.Millisecond):
	}
	close(hold)
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	events := append([]string(nil), h.events...)
	h.mu.Unlock()
	eid := sb.Engine()
	stop, start := -1, -1
	for i, ev := range events {
		if ev == "stop:"+eid && stop < 0 {
			stop = i
		}
		if ev == "start:"+eid && i > 0 && start < 0 {
			start = i
		}
	}
	if stop < 0 || start < stop {
		t.Fatalf("hook calls %v: the wake's start must follow the sleep's stop of %s", events, eid)
	}
}

// TestRemoveAfterSleepWaitsForTeardown: a remove right after a sleep, and
// the service's close, leave no engine sandbox and run every teardown.
func TestRemoveAfterSleepWaitsForTeardown(t *testing.T) {
	e := newEnv(t, Config{})
	for range 5 {
		sb := e.create(t, 128)
		if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Destroy(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		if n := e.hook.count(e.hook.stop, sb.ID); n < 1 {
			t.Fatalf("after sleep and remove AfterStop ran %d times", n)
		}
	}
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	e.m.DrainPools()
	if n := e.hook.count(e.hook.stop, sb.ID); n != 1 {
		t.Fatalf("after the pools drained the sleep's AfterStop ran %d times, want 1", n)
	}
	if ids, _ := e.eng.List(t.Context()); len(ids) != 0 {
		t.Fatalf("engine sandboxes left: %v", ids)
	}
}

// TestAdmissionExactUnderConcurrentCreates: creates racing for room under
// the overcommit limit never admit past it, and once they are done the
// in-memory committed memory leaves room for exactly what the limit has
// left: no reservation leaks, no double count stays.
func TestAdmissionExactUnderConcurrentCreates(t *testing.T) {
	total, err := memTotalMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	e := newEnv(t, Config{MemoryOvercommit: 4096.0 / float64(total)}) // eight 512 MiB sandboxes
	e.eng.Delay = 5 * time.Millisecond                                // creates overlap
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.m.Create(context.Background(), CreateRequest{Image: testImage, MemoryMiB: 512}); err == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted < 1 || admitted > 8 {
		t.Fatalf("%d of 20 concurrent creates were admitted; the limit holds 8", admitted)
	}
	committed, _ := e.st.CommittedMemoryMiB(t.Context())
	if committed != admitted*512 {
		t.Fatalf("committed memory %d MiB after %d creates of 512 MiB", committed, admitted)
	}
	for n := admitted; n < 8; n++ {
		e.create(t, 512)
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 512}); err == nil {
		t.Fatal("a ninth sandbox was admitted past the limit")
	}
}

// TestAdmitForkSharedMemory: children of an engine that shares the
// snapshot's memory with them count at sharedForkChildMiB against the
// memory floor, where counted at their limits they would not fit; the
// overcommit cap still counts their whole limits, and its refusal says so.
func TestAdmitForkSharedMemory(t *testing.T) {
	avail, err := memAvailableMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	const n, limit = 16, 512
	// Room for 16 x 64 MiB (1 GiB) with 1 GiB to spare for the host's
	// moves, not for 16 x 512 MiB.
	room := 2 * n * sharedForkChildMiB
	for _, shares := range []bool{false, true} {
		e := newEnv(t, Config{MemoryFloorMiB: avail - room})
		e.eng.SharesFork = shares
		parent := e.create(t, limit)
		res, err := e.m.Fork(t.Context(), parent.ID, n)
		if !shares {
			if err == nil || !strings.Contains(err.Error(), "each sandbox counted at its whole memory limit") {
				t.Fatalf("fork %d of %d MiB without shared memory, %d MiB of room: %v, want refused at their limits", n, limit, room, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("fork %d of %d MiB sharing the snapshot's memory, %d MiB of room: %v", n, limit, room, err)
		}
		for _, c := range res.Children {
			if c.Err != nil {
				t.Fatal(c.Err)
			}
		}
	}
	total, err := memTotalMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	// The cap holds eight 512 MiB sandboxes: one parent and 16 children of
	// it pass it, shared memory or not.
	e := newEnv(t, Config{MemoryOvercommit: 4096.0 / float64(total)})
	e.eng.SharesFork = true
	parent := e.create(t, limit)
	_, err = e.m.Fork(t.Context(), parent.ID, n)
	if err == nil || !strings.Contains(err.Error(), "count at their whole 512 MiB limits") || !strings.Contains(err.Error(), "--memory-overcommit") {
		t.Fatalf("fork past the overcommit cap: %v, want refused, counting the children's limits", err)
	}
	if committed, _ := e.st.CommittedMemoryMiB(t.Context()); committed != limit {
		t.Fatalf("committed %d MiB after a refused fork, want the parent's %d", committed, limit)
	}
}

// TestAdmitForkRecountsAfterSnapshot: a fork of a running sandbox admitted
// as sharing (the running VM's answer) whose implicit snapshot turns out
// not to share (it slept and woke in between: a stream image) is counted
// again at the children's whole limits, refused here, and leaves no
// snapshot behind.
func TestAdmitForkRecountsAfterSnapshot(t *testing.T) {
	avail, err := memAvailableMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	const n, limit = 16, 512
	e := newEnv(t, Config{MemoryFloorMiB: avail - 2*n*sharedForkChildMiB})
	e.eng.OnSharesFork = func(id, dir string) bool { return dir == "" }
	parent := e.create(t, limit)
	_, err = e.m.Fork(t.Context(), parent.ID, n)
	if err == nil || !strings.Contains(err.Error(), "each sandbox counted at its whole memory limit") {
		t.Fatalf("fork whose snapshot shares nothing: %v, want refused at the children's limits", err)
	}
	if sns, err := e.st.ListSnapshots(t.Context()); err != nil || len(sns) != 0 {
		t.Fatalf("snapshots left after the refused fork: %v (%v)", sns, err)
	}
}

// TestAdmitDuringForkCountsChildrenOnce: while a fork's children restore,
// they count toward the overcommit cap once (as their `creating` records),
// not again in the fork's reservation: a create that fits beside them is
// admitted, one that does not is refused, and nothing stays reserved after.
func TestAdmitDuringForkCountsChildrenOnce(t *testing.T) {
	total, err := memTotalMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	const n, limit = 4, 512
	e := newEnv(t, Config{MemoryOvercommit: 4096.0 / float64(total)}) // eight 512 MiB sandboxes
	parent := e.create(t, limit)
	restoring, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.eng.OnRestore = func(engine.Spec) error {
		once.Do(func() { close(restoring) })
		<-gate
		return nil
	}
	forked := make(chan error, 1)
	go func() {
		res, err := e.m.Fork(context.Background(), parent.ID, n)
		for _, c := range res.Children {
			err = errors.Join(err, c.Err)
		}
		forked <- err
	}()
	<-restoring
	// 512 (parent) + 4 x 512 (children) leave 1536 MiB under the cap.
	if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 2048}); err == nil {
		t.Error("a 2048 MiB create beside the fork was admitted past the cap")
	}
	fits, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 1536})
	close(gate)
	if err != nil {
		t.Errorf("a 1536 MiB create, which fits beside the fork's children: %v", err)
	}
	if err := <-forked; err != nil {
		t.Fatalf("fork: %v", err)
	}
	want := limit + n*limit
	if fits.ID != "" {
		want += 1536
	}
	if committed, _ := e.st.CommittedMemoryMiB(t.Context()); committed != want {
		t.Fatalf("committed %d MiB after the fork, want %d", committed, want)
	}
	e.m.admission.mu.Lock()
	floor, capped := e.m.admission.reservedMiB, e.m.admission.reservedCapMiB
	e.m.admission.mu.Unlock()
	if floor != 0 || capped != 0 {
		t.Fatalf("reserved after every operation ended: %d MiB (floor), %d MiB (cap), want none", floor, capped)
	}
}
