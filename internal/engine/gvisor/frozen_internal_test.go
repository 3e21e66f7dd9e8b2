package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestAttachToAFrozenSandboxEnds: `runsc state` asks the sandbox process,
// and waits for a frozen one without end. A restarted daemon attaches
// under contexts with no deadline (its start, settle's retries): the
// attach must still end, with Unavailable, not hang the daemon's start and
// hold the sandbox's lock for good.
func TestAttachToAFrozenSandboxEnds(t *testing.T) {
	defer func(d time.Duration) { stateWait = d }(stateWait)
	stateWait = time.Second
	dir := testenv.TempDir(t)
	e1, spec, sb := startSandbox(t, dir, "frozen0000000001")
	t.Cleanup(func() { _ = e1.Destroy(context.Background(), spec.ID) })
	pid := sb.PID()
	if err := e1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(pid, unix.SIGCONT) // before the Destroy above
	e2, err := New(Config{StateDir: dir, Runsc: testenv.Runsc(t), AgentPath: e1.cfg.AgentPath})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e2.Attach(context.Background(), spec)
		done <- err
	}()
	select {
	case err := <-done:
		if !errdefs.IsUnavailable(err) {
			t.Fatalf("attach to a frozen sandbox: %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		unix.Kill(pid, unix.SIGCONT) // lets the hung attach end
		t.Fatal("attach to a frozen sandbox, with no deadline, did not end in 10 s")
	}
	if !e2.Started(context.Background(), spec.ID) {
		t.Fatal("Started says a frozen sandbox was never started: reconcile would destroy it as unrecorded")
	}
}

// TestDestroyAFrozenSandbox: `runsc delete --force` waits without end for
// a frozen sandbox, and a removal's context has no deadline (it outlives
// the client): `clade rm` of a frozen sandbox hung for good, holding its
// lock. Its processes die by SIGKILL all the same.
func TestDestroyAFrozenSandbox(t *testing.T) {
	defer func(s, d time.Duration) { stateWait, deleteWait = s, d }(stateWait, deleteWait)
	stateWait, deleteWait = time.Second, 2*time.Second
	dir := testenv.TempDir(t)
	e, spec, sb := startSandbox(t, dir, "frozen0000000002")
	pid := sb.PID()
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Destroy(context.Background(), spec.ID) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("destroy of a frozen sandbox: %v", err)
		}
	case <-time.After(15 * time.Second):
		unix.Kill(pid, unix.SIGKILL) // lets the hung destroy end
		<-done
		t.Fatal("destroy of a frozen sandbox did not end in 15 s")
	}
	if left := testenv.ProcessesMentioning(dir); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
	if e.Started(context.Background(), spec.ID) {
		t.Fatal("runsc still knows the destroyed sandbox")
	}
}

// startSandbox starts sandbox id (128 MiB, the default image) on a new
// engine with its state in dir.
func startSandbox(t *testing.T, dir, id string) (*Engine, engine.Spec, engine.Sandbox) {
	t.Helper()
	_, agent := testenv.Binaries(t)
	e, err := New(Config{StateDir: dir, Runsc: testenv.Runsc(t), AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	spec := engine.Spec{ID: id, RootFS: filepath.Join(testenv.ImagesDir(t), "default", "rootfs"), MemoryMiB: 128}
	sb, err := e.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return e, spec, sb
}

// TestAttachThawsAPausedSandbox: a sandbox left paused (runsc's pause,
// the sentry's tasks stopped) or frozen (its cgroup's freezer) by a daemon
// killed before it undid that never runs again on its own: its agent never
// redials, its clock stands still. A restarted daemon's attach took a
// paused one for not running (and reconcile destroyed it), and waited in
// vain for a frozen one. The attach must thaw it: exec works, time moves.
func TestAttachThawsAPausedSandbox(t *testing.T) {
	for _, tc := range []struct {
		name, id string
		freeze   func(t *testing.T, e *Engine, id string)
	}{
		{"runsc pause", "paused0000000001", func(t *testing.T, e *Engine, id string) {
			if err := e.runsc(t.Context(), id, "pause", id); err != nil {
				t.Fatal(err)
			}
			if st, err := e.state(t.Context(), id); err != nil || st.Status != "paused" {
				t.Fatalf("after runsc pause: %+v %v, want paused", st, err)
			}
		}},
		{"cgroup freezer", "paused0000000002", func(t *testing.T, e *Engine, id string) {
			path := freezerState(t, id)
			if err := os.WriteFile(path, []byte("FROZEN"), 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.WriteFile(path, []byte("THAWED"), 0) }) // before the Destroy
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(d time.Duration) { stateWait = d }(stateWait)
			stateWait = 2 * time.Second
			dir := testenv.TempDir(t)
			id := tc.id
			e1, spec, _ := startSandbox(t, dir, id)
			t.Cleanup(func() { _ = e1.Destroy(context.Background(), spec.ID) })
			tc.freeze(t, e1, id)
			if err := e1.Close(); err != nil {
				t.Fatal(err)
			}
			e2, err := New(Config{StateDir: dir, Runsc: testenv.Runsc(t), AgentPath: e1.cfg.AgentPath})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			sb, err := e2.Attach(ctx, spec)
			if err != nil {
				t.Fatalf("attach to a %s sandbox: %v, want it thawed and attached", tc.name, err)
			}
			r := enginetest.Exec(t, sb, "sh", "-c", "date +%s%N; sleep 0.2; date +%s%N")
			var a, b int64
			if _, err := fmt.Sscan(r.Stdout, &a, &b); err != nil || b-a < int64(150*time.Millisecond) {
				t.Fatalf("the clock inside after the thaw: %q (%v), want it to move", r.Stdout, err)
			}
		})
	}
}

// freezerState is the freezer.state of sandbox id's cgroup (cgroup v1);
// the test skips on a host without the freezer controller.
func freezerState(t *testing.T, id string) string {
	t.Helper()
	cg := cgroupsOnce()
	if cg.freeze == "" {
		t.Skip("no cgroup v1 freezer on this host")
	}
	p := filepath.Join(cg.freeze, "clade", id, "freezer.state")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("the sandbox has no freezer cgroup: %v", err)
	}
	return p
}

// TestDestroyACgroupFrozenSandbox: the processes of a cgroup the v1
// freezer holds do not die of SIGKILL until it is thawed, so neither
// `runsc delete` nor the SIGKILLs after it ended a frozen sandbox.
func TestDestroyACgroupFrozenSandbox(t *testing.T) {
	dir := testenv.TempDir(t)
	e, spec, _ := startSandbox(t, dir, "frozen0000000003")
	path := freezerState(t, spec.ID)
	if err := os.WriteFile(path, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(path, []byte("THAWED"), 0) })
	t0 := time.Now()
	err := e.Destroy(context.Background(), spec.ID)
	took := time.Since(t0)
	t.Logf("destroy of a cgroup-frozen sandbox: %s", took.Round(time.Millisecond))
	if err != nil {
		t.Fatalf("destroy of a cgroup-frozen sandbox: %v", err)
	}
	if took > 10*time.Second {
		t.Errorf("destroy of a cgroup-frozen sandbox took %s, want seconds", took.Round(time.Millisecond))
	}
	if left := testenv.ProcessesMentioning(dir); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}
