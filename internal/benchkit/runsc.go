package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/internal/engine/gvisor/bundle"
	"golang.org/x/sys/unix"
)

// baselineCgroup is the cgroup parent of baseline sandboxes, removed at the
// end when empty.
const baselineCgroup = "clade-bench-baseline"

// runscTarget is the baseline: the same work done the way a user would
// script it without clade, with plain runsc commands on a private --root
// and bundles over the default image's rootfs with `sleep infinity` as
// init. Flags match clade's gvisor engine (systrap, no network, a
// per-sandbox overlay upper dir) so the difference is clade itself.
type runscTarget struct {
	bin       string
	rootfs    string
	dir       string // state/, bundles/, images/
	memoryMiB int
	cpus      float64
	prefix    string // ids are prefix + 8 hex digits: runsc matches ids by prefix, so all have one length
	seq       atomic.Int64
	ledger

	mu   sync.Mutex
	args map[string][]string // init argv by container id and by image dir: a restore gets the spec it was checkpointed with
}

func newRunscTarget(runsc, rootfs string, memoryMiB int, cpus float64) (*runscTarget, error) {
	if fi, err := os.Stat(runsc); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("runsc %q not found: run `make deps` or set --runsc", runsc)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		return nil, fmt.Errorf("rootfs %s has no /bin/sh: point --rootfs at an image's rootfs dir", rootfs)
	}
	dir, err := os.MkdirTemp("", "clade-bench-")
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"state", "bundles", "images"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &runscTarget{bin: runsc, rootfs: rootfs, dir: dir, memoryMiB: memoryMiB, cpus: cpus,
		prefix: hex.EncodeToString(b[:]), args: map[string][]string{}}, nil
}

func (t *runscTarget) side() string { return "baseline" }

func (t *runscTarget) newID() string { return fmt.Sprintf("%s%08x", t.prefix, t.seq.Add(1)) }

func (t *runscTarget) bundle(id string) string { return filepath.Join(t.dir, "bundles", id) }

// runsc runs one command about id with the same global flags every time
// (runsc requires that), stdio on the bundle's log file: run and restore
// hand their stdio to the sandbox, so a pipe would stay open as long as it
// lives.
func (t *runscTarget) runsc(ctx context.Context, id string, args ...string) error {
	logPath := filepath.Join(t.bundle(id), "runsc.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	flags := []string{"--root", filepath.Join(t.dir, "state"), "--platform", "systrap", "--network", "none",
		"--overlay2", "root:dir=" + filepath.Join(t.bundle(id), "upper")}
	cmd := exec.CommandContext(ctx, t.bin, append(flags, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s %s: %w: %s", args[0], id, err, logTail(logPath, start))
	}
	return nil
}

// logTail returns what a log gained after offset, shortened to its end.
func logTail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	s := strings.TrimSpace(string(b[offset:]))
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	return s
}

// writeBundle writes id's OCI bundle with the engine's writer: clade's
// spec minus the agent (its mounts, capability and environment).
func (t *runscTarget) writeBundle(id string, args []string) error {
	if err := os.MkdirAll(filepath.Join(t.bundle(id), "upper"), 0o700); err != nil {
		return err
	}
	t.mu.Lock()
	t.args[id] = args
	t.mu.Unlock()
	return bundle.Write(t.bundle(id), bundle.Spec{
		Args:      args,
		Hostname:  id,
		RootFS:    t.rootfs,
		Cgroup:    "/" + baselineCgroup + "/" + id,
		MemoryMiB: t.memoryMiB,
		CPUs:      t.cpus,
	})
}

// start runs a new container with init args, not waiting for it.
func (t *runscTarget) start(ctx context.Context, args []string) (string, error) {
	id := t.newID()
	t.add("sandbox", id)
	if err := t.writeBundle(id, args); err != nil {
		return id, err
	}
	return id, t.runsc(ctx, id, "run", "--bundle", t.bundle(id), "--detach", id)
}

func (t *runscTarget) create(ctx context.Context) (string, error) {
	id, err := t.start(ctx, []string{"/bin/sleep", "infinity"})
	if err != nil {
		return id, err
	}
	return id, t.exec(ctx, id)
}

// createHolding makes the holder the container's init: processes started
// by `runsc exec` do not survive a restore.
func (t *runscTarget) createHolding(ctx context.Context, mib int) (string, error) {
	id, err := t.start(ctx, []string{"/usr/bin/python3", "-c", holdScript(mib)})
	if err != nil {
		return id, err
	}
	// The holder says it is done with a file; wait for it inside, in one call.
	return id, t.runsc(ctx, id, "exec", id, "/bin/sh", "-c", "until [ -e /tmp/touched ]; do sleep 0.02; done")
}

func (t *runscTarget) exec(ctx context.Context, id string) error {
	return t.runsc(ctx, id, "exec", id, "/bin/true")
}

func (t *runscTarget) remove(ctx context.Context, id string) error {
	// kill first so delete does not wait for a graceful stop; it fails
	// harmlessly for a container that is gone.
	_ = t.runsc(ctx, id, "kill", id, "KILL")
	if err := t.runsc(ctx, id, "delete", "--force", id); err != nil {
		return err
	}
	if err := os.RemoveAll(t.bundle(id)); err != nil {
		return err
	}
	t.done("sandbox", id)
	return nil
}

func (t *runscTarget) snapshot(ctx context.Context, id string) (string, error) {
	img := filepath.Join(t.dir, "images", t.newID())
	t.add("snapshot", img)
	t.mu.Lock()
	t.args[img] = t.args[id]
	t.mu.Unlock()
	return img, t.runsc(ctx, id, "checkpoint", "--leave-running", "--image-path", img, id)
}

func (t *runscTarget) removeSnapshot(_ context.Context, img string) error {
	if err := os.RemoveAll(img); err != nil {
		return err
	}
	t.done("snapshot", img)
	return nil
}

// fork restores n children twice the core count at a time, each followed by
// an exec: the same concurrency as the daemon's default, so the ratio
// compares the work, not the scheduling (4 at once beat 2 on 2 cores for
// plain runsc restores too).
func (t *runscTarget) fork(ctx context.Context, img string, n int) ([]string, error) {
	t.mu.Lock()
	args := t.args[img]
	t.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = t.newID()
		t.add("sandbox", ids[i])
	}
	return ids, parallel(ids, 2*runtime.NumCPU(), func(id string) error {
		if err := t.writeBundle(id, args); err != nil {
			return err
		}
		if err := t.runsc(ctx, id, "restore", "--image-path", img, "--bundle", t.bundle(id), "--detach", id); err != nil {
			return err
		}
		return t.exec(ctx, id)
	})
}

func (t *runscTarget) sleepImage(id string) string {
	return filepath.Join(t.dir, "images", "sleep-"+id)
}

// sleep is checkpoint (which stops the sandbox) and delete, which a
// restore under the same id needs.
func (t *runscTarget) sleep(ctx context.Context, id string) error {
	img := t.sleepImage(id)
	if err := os.RemoveAll(img); err != nil {
		return err
	}
	if err := t.runsc(ctx, id, "checkpoint", "--image-path", img, id); err != nil {
		return err
	}
	return t.runsc(ctx, id, "delete", "--force", id)
}

func (t *runscTarget) wake(ctx context.Context, id string) error {
	if err := t.runsc(ctx, id, "restore", "--image-path", t.sleepImage(id), "--bundle", t.bundle(id), "--detach", id); err != nil {
		return err
	}
	return t.exec(ctx, id)
}

func (t *runscTarget) cleanup(ctx context.Context) error {
	err := parallel(t.list("sandbox"), 4, func(id string) error { return t.remove(ctx, id) })
	for _, img := range t.list("snapshot") {
		err = errors.Join(err, t.removeSnapshot(ctx, img))
	}
	return err
}

// close removes everything, including runsc's shared null network
// namespace mount under its root and the cgroup parent.
func (t *runscTarget) close(ctx context.Context) error {
	err := t.cleanup(ctx)
	if uerr := unix.Unmount(filepath.Join(t.dir, "state", "null-netns"), unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("umount null-netns: %w", uerr))
	}
	if err == nil {
		err = os.RemoveAll(t.dir)
	}
	// Empty parents only; another run may be using them.
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + baselineCgroup)
	for _, cg := range cgs {
		_ = os.Remove(cg)
	}
	return err
}
