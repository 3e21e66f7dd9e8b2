package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestReconcileKeepsARunningSandboxItCannotReachYet: a restart whose
// attach of a running sandbox fails with Unavailable (its agent did not
// answer in time: a loaded host, a frozen sandbox) must keep it, running,
// and attach it once it answers. It used to be destroyed, the user's work
// with it.
func TestReconcileKeepsARunningSandboxItCannotReachYet(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	thaw := unreachable(e)
	if err := e.restartUnsettled(t, t.Context()); !errdefs.IsUnavailable(err) {
		t.Fatalf("reconcile: %v, want the Unavailable of the attach", err)
	}
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("after the failed attach the sandbox is %s, want running", got)
	}
	if !e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("the restart destroyed a running sandbox it could not reach")
	}
	if _, err := e.m.running(t.Context(), sb.ID, true); !errdefs.IsUnavailable(err) {
		t.Fatalf("a request before it is reattached: %v, want Unavailable (retry)", err)
	}
	thaw()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := e.m.running(t.Context(), sb.ID, true)
		if err == nil {
			break
		}
		if !errdefs.IsUnavailable(err) || time.Now().After(deadline) {
			t.Fatalf("once it answers: %v, want it reattached", err)
		}
		time.Sleep(50 * time.Millisecond) // polling until the retry lands
	}
}

// The tests below follow that one into the other branches of reconcile that attach to a sandbox the engine may well
// still run: none may destroy it because its agent did not answer in time
// or the daemon began to stop.

// unreachable makes e's engine answer attaches Unavailable (a frozen
// sandbox, a loaded host) until the returned func is called.
func unreachable(e *env) (thaw func()) {
	var frozen atomic.Bool
	frozen.Store(true)
	e.eng.OnAttach = func(engine.Spec) error {
		if frozen.Load() {
			return errdefs.New(errdefs.Unavailable, "agent did not connect in time")
		}
		return nil
	}
	return func() { frozen.Store(false) }
}

// restartUnsettled is restart for a reconcile that ends with err.
func (e *env) restartUnsettled(t *testing.T, ctx context.Context) error {
	t.Helper()
	cfg := e.cfg
	cfg.MemoryFloorMiB, cfg.PressureFloorMiB = 1, -1
	e.m = New(cfg, e.eng, e.st, e.imgs)
	t.Cleanup(e.m.stopBg) // settle's retries
	return e.m.Reconcile(ctx)
}

// waitRunning polls until sandbox id serves (settle's retry lands).
func (e *env) waitRunning(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.m.running(t.Context(), id, true)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("once it answers: %v (state %s), want it reattached", err, e.state(t, id))
		}
		time.Sleep(50 * time.Millisecond) // polling until the retry lands
	}
}

// TestReconcileKeepsASandboxWhoseSleepWasCutShortItCannotReachYet: a sleep
// cut short before its image was sealed leaves the sandbox running (the
// engine stops it only once the image is sealed). An attach that fails
// with Unavailable must keep it: it used to be destroyed and recorded
// stopped, its unsealed image no use to anyone.
func TestReconcileKeepsASandboxWhoseSleepWasCutShortItCannotReachYet(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	_ = os.MkdirAll(e.m.cfg.sleepDir(sb.ID), 0o700)
	_ = os.WriteFile(filepath.Join(e.m.cfg.sleepDir(sb.ID), "pages.img"), []byte("partial"), 0o600)
	setState(t, e, sb.ID, store.StateSuspending)
	thaw := unreachable(e)
	if err := e.restartUnsettled(t, t.Context()); !errdefs.IsUnavailable(err) {
		t.Fatalf("reconcile: %v, want the Unavailable of the attach", err)
	}
	if !e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("the restart destroyed a running sandbox whose sleep was cut short, as it could not reach it")
	}
	if got := e.state(t, sb.ID); got != store.StateSuspending {
		t.Fatalf("after the failed attach the sandbox is %s, want suspending (settle retries)", got)
	}
	thaw()
	e.waitRunning(t, sb.ID)
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("reattached, the sandbox is %s, want running", got)
	}
	if _, err := os.Stat(e.m.cfg.sleepDir(sb.ID)); !os.IsNotExist(err) {
		t.Error("a reattached sandbox kept its partial sleep image")
	}
}

// stopHook says snapshots must stop the sandbox (as volumes do).
type stopHook struct{}

func (stopHook) Name() string                                                   { return "stop" }
func (stopHook) BeforeStart(context.Context, store.Sandbox, *engine.Spec) error { return nil }
func (stopHook) AfterStart(context.Context, store.Sandbox, engine.Sandbox) error {
	return nil
}
func (stopHook) AfterStop(context.Context, store.Sandbox) error                    { return nil }
func (stopHook) AfterRemove(context.Context, store.Sandbox) error                  { return nil }
func (stopHook) Reconcile(context.Context, []store.Sandbox, []store.Sandbox) error { return nil }
func (stopHook) SnapshotOptions(rec store.Sandbox) (store.Options, bool)           { return rec.Opts, true }
func (stopHook) SnapshotTaken(context.Context, store.Sandbox, store.Snapshot) error {
	return nil
}
func (stopHook) SnapshotRemoved(context.Context, store.Snapshot) error { return nil }

// TestReconcileKeepsASandboxWhoseSnapshotWasCutBeforeItsSeal: a snapshot
// that stops its sandbox (volumes), cut short before its seal, leaves the
// sandbox running. An attach that fails with Unavailable must keep it,
// and the half-made snapshot go: it used to be destroyed and recorded
// stopped ("its processes are gone").
func TestReconcileKeepsASandboxWhoseSnapshotWasCutBeforeItsSeal(t *testing.T) {
	e := newEnv(t, Config{Hooks: []Hook{stopHook{}}})
	sb := e.create(t, 128)
	sn := store.Snapshot{ID: newID(), Sandbox: sb.ID, Image: sb.Image, State: store.SnapshotCreating, MemoryMiB: sb.MemoryMiB,
		Path: filepath.Join(e.cfg.SnapshotDir, "cut"), RootFS: sb.RootFS, Opts: sb.Opts, CreatedAt: time.Now()}
	if err := e.st.InsertSnapshot(t.Context(), sn); err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll(sn.Path, 0o700)
	_ = os.WriteFile(filepath.Join(sn.Path, "pages.img"), []byte("partial"), 0o600)
	thaw := unreachable(e)
	if err := e.restartUnsettled(t, t.Context()); !errdefs.IsUnavailable(err) {
		t.Fatalf("reconcile: %v, want the Unavailable of the attach", err)
	}
	if !e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("the restart destroyed a running sandbox whose snapshot was cut before its seal, as it could not reach it")
	}
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("after the failed attach the sandbox is %s, want running", got)
	}
	if _, err := e.st.GetSnapshot(t.Context(), sn.ID); !errdefs.IsNotFound(err) {
		t.Errorf("the half-made snapshot: %v, want it gone", err)
	}
	if _, err := os.Stat(sn.Path); !os.IsNotExist(err) {
		t.Error("the half-made snapshot's files are kept")
	}
	thaw()
	e.waitRunning(t, sb.ID)
}

// TestReconcileCutShortByShutdownKeepsTheSandbox: a daemon told to stop
// while it reconciles (SIGTERM during a start) ends its context; whatever
// the attach then fails with says nothing of the sandbox, which must stay.
func TestReconcileCutShortByShutdownKeepsTheSandbox(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	ctx, cancel := context.WithCancel(t.Context())
	e.eng.OnAttach = func(engine.Spec) error {
		cancel() // the signal comes while the engine works
		return errors.New("runsc: signal: killed")
	}
	if err := e.restartUnsettled(t, ctx); err == nil {
		t.Fatal("a reconcile cut short says nothing went wrong")
	}
	if !e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("a reconcile cut short by a shutdown destroyed a running sandbox")
	}
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("after the shutdown the sandbox is %s, want running", got)
	}
}
