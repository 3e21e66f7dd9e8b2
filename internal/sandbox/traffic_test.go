package sandbox

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// waitState waits (polling the store) until sandbox id is in state want.
func (e *env) waitState(t *testing.T, id, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for e.state(t, id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %s after %s, want %s", id, e.state(t, id), within, want)
		}
		time.Sleep(20 * time.Millisecond) // polling the store for a state change
	}
}

func (e *env) createOpts(t *testing.T, o store.Options) store.Sandbox {
	t.Helper()
	sb, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128, Opts: o})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func TestConcurrentRequestsWakeOnce(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	before := e.m.Counters().Wakes.Load()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.GuestWaking(t.Context(), sb.ID)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.m.Counters().Wakes.Load() - before; n != 1 {
		t.Fatalf("20 concurrent requests to a sleeping sandbox woke it %d times, want 1", n)
	}
}

func TestNewSandboxesGetTheirOwnTrafficToken(t *testing.T) {
	e := newEnv(t, Config{})
	a, b := e.create(t, 128), e.create(t, 128)
	if a.Opts.TrafficToken == "" || a.Opts.TrafficToken == b.Opts.TrafficToken {
		t.Fatalf("tokens %q and %q: want two different non-empty ones", a.Opts.TrafficToken, b.Opts.TrafficToken)
	}
	res, err := e.m.Fork(t.Context(), a.ID, 1)
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %v", err, res.Children)
	}
	c, err := e.m.Get(t.Context(), res.Children[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Opts.TrafficToken == "" || c.Opts.TrafficToken == a.Opts.TrafficToken {
		t.Fatalf("a fork child has token %q, its parent %q: want its own", c.Opts.TrafficToken, a.Opts.TrafficToken)
	}
}

func TestLifetimeValidation(t *testing.T) {
	e := newEnv(t, Config{})
	for _, o := range []store.Options{
		{IdleSleepMS: -1},
		{TimeoutMS: -5},
		{TimeoutMS: 1000, OnTimeout: "explode"},
	} {
		if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128, Opts: o}); err == nil {
			t.Errorf("create with %+v succeeded, want invalid_argument", o)
		}
	}
	sb := e.createOpts(t, store.Options{TimeoutMS: 60_000})
	if sb.Opts.OnTimeout != OnTimeoutRemove || sb.Opts.ExpiresAt == nil {
		t.Fatalf("a timeout without on_timeout: %+v, want rm and an expiry", sb.Opts)
	}
}

func TestIdleSleepAndHold(t *testing.T) {
	e := newEnv(t, Config{})
	held := e.createOpts(t, store.Options{IdleSleepMS: 300})
	idle := e.createOpts(t, store.Options{IdleSleepMS: 300})
	never := e.create(t, 128)
	release := e.m.Traffic().Hold(held.ID)
	// The watcher starts once the hold is in place: started before, it
	// could put held to sleep while the creates after it took longer
	// than its idle time (a loaded machine).
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.m.Lifetimes().WatchLifetimes(ctx)
	e.waitState(t, idle.ID, store.StateSleeping, 5*time.Second)
	if s := e.state(t, held.ID); s != store.StateRunning {
		t.Fatalf("a held sandbox is %s, want running", s)
	}
	release()
	e.waitState(t, held.ID, store.StateSleeping, 5*time.Second)
	if s := e.state(t, never.ID); s != store.StateRunning {
		t.Fatalf("a sandbox without idle sleep is %s", s)
	}
	if n := e.m.Counters().IdleSleeps.Load(); n != 2 {
		t.Fatalf("idle sleeps %d, want 2", n)
	}
}

func TestTimeoutRemoveSleepAndRenew(t *testing.T) {
	e := newEnv(t, Config{})
	// renewed first: its first timeout passes before the others', so the
	// sweep that removes rm would have removed it too had the renewal not
	// replaced it. The watcher starts once the renewal is made: started
	// before, it could apply the first timeout while the create and the
	// renewal took longer than it (a loaded machine).
	renewed := e.createOpts(t, store.Options{TimeoutMS: 300})
	if _, err := e.m.Lifetimes().SetTimeout(t.Context(), renewed.ID, time.Hour, ""); err != nil {
		t.Fatal(err)
	}
	rm := e.createOpts(t, store.Options{TimeoutMS: 300})
	sl := e.createOpts(t, store.Options{TimeoutMS: 300, OnTimeout: OnTimeoutSleep})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.m.Lifetimes().WatchLifetimes(ctx)
	e.waitState(t, rm.ID, "gone", 5*time.Second)
	e.waitState(t, sl.ID, store.StateSleeping, 5*time.Second)
	if s := e.state(t, renewed.ID); s != store.StateRunning {
		t.Fatalf("a renewed sandbox is %s", s)
	}
	// The state shows sleeping before the expiry is cleared, both under
	// the sandbox's lock: take it to read what the timeout left.
	rec, unlock, err := e.m.locks.sandbox(t.Context(), sl.ID)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if rec.Opts.ExpiresAt != nil {
		t.Fatalf("a timeout sleep left expiry %v", rec.Opts.ExpiresAt)
	}
	// A wake starts the next timeout.
	rec, err = e.m.Wake(t.Context(), sl.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Opts.ExpiresAt == nil {
		t.Fatal("a woken sandbox has no new timeout")
	}
	e.waitState(t, sl.ID, store.StateSleeping, 5*time.Second)
	if _, err := e.m.Lifetimes().SetTimeout(t.Context(), renewed.ID, time.Second, "bogus"); err == nil {
		t.Fatal("on_timeout bogus accepted")
	}
}

// TestReadsNeverWake checks that wakes are explicit: Guest, Traffic.Dial
// and Traffic.Running refuse (or report) a sleeping sandbox and leave it
// asleep; GuestWaking and DialWaking wake it.
func TestReadsNeverWake(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	before := e.m.Counters().Wakes.Load()
	if _, err := e.m.Guest(t.Context(), sb.ID); !errdefs.IsConflict(err) {
		t.Errorf("Guest of a sleeping sandbox: %v, want a Conflict", err)
	}
	if _, err := e.m.Traffic().Dial(t.Context(), sb.ID, 8080); !errdefs.IsConflict(err) {
		t.Errorf("Dial to a sleeping sandbox: %v, want a Conflict", err)
	}
	if e.m.Traffic().Running(sb.ID) {
		t.Error("Running says a sleeping sandbox runs")
	}
	if st := e.state(t, sb.ID); st != store.StateSleeping {
		t.Fatalf("after the reads the sandbox is %s, want sleeping", st)
	}
	if n := e.m.Counters().Wakes.Load() - before; n != 0 {
		t.Fatalf("the reads woke the sandbox %d times, want 0", n)
	}
	// The fake agent refuses every port: the dial fails after its wake
	// (held, as for a woken sandbox, until ctx ends).
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := e.m.Traffic().DialWaking(ctx, sb.ID, 8080); err == nil || errdefs.IsConflict(err) {
		t.Errorf("DialWaking to a sleeping sandbox: %v, want it woken (and the port refused)", err)
	}
	if st := e.state(t, sb.ID); st != store.StateRunning {
		t.Fatalf("after DialWaking the sandbox is %s, want running", st)
	}
	if !e.m.Traffic().Running(sb.ID) {
		t.Error("Running says a woken sandbox does not run")
	}
	if _, err := e.m.Guest(t.Context(), sb.ID); err != nil {
		t.Errorf("Guest of a running sandbox: %v", err)
	}
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.GuestWaking(t.Context(), sb.ID); err != nil {
		t.Fatalf("GuestWaking of a sleeping sandbox: %v", err)
	}
	if n := e.m.Counters().Wakes.Load() - before; n != 2 {
		t.Fatalf("DialWaking and GuestWaking woke the sandbox %d times, want 2", n)
	}
}

// TestRetireSparesLookedUp: a sandbox a request has just looked up (an
// exec on its way to the agent, which counts the call only once it is
// opened) is not taken out of service for a sleep within lookupGrace,
// however short the idle time asked; one unused for longer is, in the
// same step: it is no longer live.
func TestRetireSparesLookedUp(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.GuestWaking(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if live, why := e.m.traffic.retire(sb.ID, time.Millisecond); live != nil || why == "" {
		t.Fatalf("retire just after a lookup: %v %q, want busy", live, why)
	}
	if !e.m.Traffic().Running(sb.ID) {
		t.Fatal("a refused retire took the sandbox out of service")
	}
	unused(e.m, sb.ID)
	live, why := e.m.traffic.retire(sb.ID, time.Millisecond)
	if live == nil || why != "" {
		t.Fatalf("retire of an unused sandbox: %v %q, want it retired", live, why)
	}
	if e.m.Traffic().Running(sb.ID) {
		t.Fatal("a retired sandbox is still live")
	}
	e.m.traffic.relive(sb.ID, live)
}

// TestFailedIdleSleepBacksOff: a sandbox whose idle sleep failed (its
// checkpoint refused) is idle again only after its idle time, not at once:
// before, the failed sleep's drop forgot when it was last used and the
// relive did not put it back, so it looked idle for ever and the idle
// sleeper tried a checkpoint again every tick (200 ms), the pressure
// sleeper took it first.
func TestFailedIdleSleepBacksOff(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.createOpts(t, store.Options{IdleSleepMS: 300})
	var tries atomic.Int32
	e.eng.OnCheckpoint = func(string) error {
		tries.Add(1)
		return errdefs.New(errdefs.Internal, "checkpoint refused")
	}
	e.m.traffic.mu.Lock()
	e.m.traffic.lastUsed[sb.ID] = time.Now().Add(-time.Hour)
	e.m.traffic.mu.Unlock()
	e.m.lifetimes.sleepIdle(t.Context(), sb.ID)
	if tries.Load() != 1 {
		t.Fatalf("%d checkpoints, want the idle sleep's 1", tries.Load())
	}
	if e.state(t, sb.ID) != store.StateRunning {
		t.Fatalf("after a failed idle sleep the sandbox is %s", e.state(t, sb.ID))
	}
	if e.m.traffic.idleFor(sb.ID, 300*time.Millisecond) {
		t.Error("right after a failed idle sleep the sandbox counts as idle for its idle time: the sleeper would try again at once")
	}
	execOK(t, e.m, sb.ID, "after a failed idle sleep")
	e.m.lifetimes.sleepIdle(t.Context(), sb.ID)
	if n := tries.Load(); n != 1 {
		t.Errorf("%d checkpoints, want 1: the idle sleeper tried again right after the failure", n)
	}
}

// execOK checks that an exec on sandbox id starts and ends well: its agent
// connection serves (a sleep that failed put it back in service).
func execOK(t *testing.T, m *Manager, id, when string) {
	t.Helper()
	g, err := m.GuestWaking(t.Context(), id)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	p, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatalf("%s: exec: %v", when, err)
	}
	defer p.Close()
	if exit, err := p.Wait(t.Context()); err != nil || exit.Code != 0 {
		t.Errorf("%s: exec: exit %+v %v", when, exit, err)
	}
}
