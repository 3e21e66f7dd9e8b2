package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// A sleep without memory (E2B's pause with memory: false) keeps the
// sandbox's files and not its processes: the wake starts the sandbox's
// userland afresh on the files it had. It is a sleep like any other in
// the state table (running -> suspending -> sleeping -> waking -> running)
// whose sealed image carries a marker, freshMarker, inside its manifest:
// the wake, after the engine restored the image and before the record says
// running, kills every process of the sandbox but its agent (PID 1), which
// leaves what a new sandbox has: the agent alone, on the files. The marker
// lives with the image (sealed, verified, copied to the object store with
// it), so a restart's reconcile of a wake cut short does the same before
// it records the sandbox running, and a sleep with memory (the next one)
// writes a new image without it.
//
// The engines keep a sandbox's written files in its checkpoint (gVisor's
// root upper layer is a tmpfs of the sentry), so the image still holds the
// memory while the sandbox sleeps: what the mode saves is nothing on disk,
// what it gives is E2B's behaviour (no process survives the pause, the
// files do).

// freshMarker, in a sleep image, says its wake starts the processes afresh.
const freshMarker = "fresh-start"

type filesOnlyKey struct{}

// SleepFiles puts a running sandbox to sleep keeping its files but not
// its processes: its wake starts it afresh on the files (see above).
// Sleeping a sleeping sandbox is a no-op (it keeps what its sleep kept).
func (m *Manager) SleepFiles(ctx context.Context, ref string) (store.Sandbox, error) {
	return m.Sleep(context.WithValue(ctx, filesOnlyKey{}, true), ref)
}

// filesOnly reports whether ctx asks a sleep to keep the files only.
func filesOnly(ctx context.Context) bool {
	v, _ := ctx.Value(filesOnlyKey{}).(bool)
	return v
}

// markFresh writes freshMarker into the sleep image dir before it is
// sealed, when ctx asks for a sleep without memory.
func markFresh(ctx context.Context, dir string) error {
	if !filesOnly(ctx) {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, freshMarker), []byte("the wake kills every process but the agent\n"), 0o600)
}

// freshStartScript kills every process of the sandbox but PID 1 (the
// agent) and itself, until none is left: kill(-1) spares the caller and
// init. It runs no other program (a sleep(1) would be killed too).
const freshStartScript = `i=0
while [ $i -lt 5000 ]; do
  kill -KILL -1 2>/dev/null
  n=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] || [ "$p" = "$$" ] || n=$((n+1))
  done
  [ $n = 0 ] && exit 0
  i=$((i+1))
done
echo "processes are left after 5000 rounds of kill -KILL -1" >&2
exit 1`

// startFresh kills the processes of sb, just restored from the image in
// dir, when the image says its wake starts afresh. Guarded by the
// sandbox's lock (the sandbox is not yet recorded running: nothing else
// runs in it).
func startFresh(ctx context.Context, sb engine.Sandbox, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, freshMarker)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	g := sb.Guest()
	if g.SupportsKillAll(ctx) {
		// The agent kills them itself: no program of the sandbox's runs
		// (its /bin/sh may be gone, or replaced by one that exits at once).
		if err := g.KillAll(ctx); err != nil {
			return errdefs.New(errdefs.Internal, "start sandbox %s afresh after a sleep without memory: %v", sb.ID(), err)
		}
		return nil
	}
	// An older agent (a sandbox made by an older clade): a shell does it.
	req := guest.ExecRequest{Argv: []string{"/bin/sh", "-c", freshStartScript}}
	if g.SupportsUser(ctx) {
		req.User = "0"
	}
	p, err := g.Exec(ctx, req)
	if err != nil {
		return errdefs.New(errdefs.Internal, "start sandbox %s afresh after a sleep without memory: %v", sb.ID(), err)
	}
	defer p.Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stdout) }()
	msg, _ := io.ReadAll(io.LimitReader(p.Stderr, 4096))
	exit, err := p.Wait(ctx)
	if err == nil && exit.Code != 0 {
		err = errors.New(string(msg) + exit.Error)
	}
	if err != nil {
		return errdefs.New(errdefs.Internal, "start sandbox %s afresh after a sleep without memory: %v", sb.ID(), err)
	}
	return nil
}
