package gvisor

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
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
