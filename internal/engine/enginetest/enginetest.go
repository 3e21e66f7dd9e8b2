// Package enginetest is the conformance suite every clade engine passes,
// against the real engine (no fakes).
package enginetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"golang.org/x/sys/unix"
)

// Factory returns a new engine on stateDir; two engines made on the same
// stateDir stand for a daemon and its successor after a restart.
type Factory func(t *testing.T, stateDir string) engine.Engine

// Env is what the suite needs besides the engine.
type Env struct {
	RootFS   string
	StateDir func(t *testing.T) string
	// DiskUsage returns the bytes of host disk sandbox id's writes take,
	// including files the engine holds open but unlinked.
	DiskUsage func(t *testing.T, e engine.Engine, id string) int64
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Result is the outcome of one exec.
type Result struct {
	Stdout, Stderr string
	Exit           guest.ExitStatus
}

// Exec runs argv in sb and collects its output.
func Exec(t testing.TB, sb engine.Sandbox, argv ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sb.Guest().Exec(ctx, guest.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	var out, errb bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&out, p.Stdout) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&errb, p.Stderr) }()
	wg.Wait()
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return Result{Stdout: out.String(), Stderr: errb.String(), Exit: exit}
}

// smallFS mounts a file system of mib MiB (a tmpfs: it fills like a small
// disk and needs no loop device) and returns its path; it is unmounted when
// the test ends.
func smallFS(t *testing.T, mib int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", mib)); err != nil {
		t.Fatalf("mount a %d MiB tmpfs (needs root): %v", mib, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Reconfigure applies spec's guest setup to sb, as the lifecycle does after
// a restore or a prepared create.
func Reconfigure(t testing.TB, sb engine.Sandbox, spec engine.Spec) {
	t.Helper()
	if err := sb.Guest().Reconfigure(t.Context(), guest.Config{Hostname: spec.Hostname}); err != nil {
		t.Fatalf("reconfigure %s: %v", sb.ID(), err)
	}
}

// Run runs the conformance suite.
func Run(t *testing.T, env Env, newEngine Factory) {
	create := func(t *testing.T, e engine.Engine, spec engine.Spec) engine.Sandbox {
		t.Helper()
		if spec.ID == "" {
			spec.ID = newID()
		}
		spec.RootFS = env.RootFS
		if spec.Hostname == "" {
			spec.Hostname = "conformance"
		}
		if spec.MemoryMiB == 0 {
			spec.MemoryMiB = 256
		}
		sb, err := e.Create(t.Context(), spec)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() {
			if err := e.Destroy(context.Background(), spec.ID); err != nil {
				t.Errorf("destroy %s: %v", spec.ID, err)
			}
		})
		return sb
	}

	t.Run("CreateExecDestroy", func(t *testing.T) {
		dir := env.StateDir(t)
		e := newEngine(t, dir)
		id := newID()
		sb := create(t, e, engine.Spec{ID: id, Hostname: "box-one", Env: []string{"GREETING=hi there"}})
		if sb.ID() != id {
			t.Fatalf("ID() = %q, want %q", sb.ID(), id)
		}
		r := Exec(t, sb, "sh", "-c", `echo "$GREETING from $(hostname)"; echo oops >&2; exit 7`)
		if r.Stdout != "hi there from box-one\n" || r.Stderr != "oops\n" || r.Exit.Code != 7 {
			t.Fatalf("exec = %+v, want stdout %q, stderr %q, code 7", r, "hi there from box-one\n", "oops\n")
		}
		ids, err := e.List(t.Context())
		if err != nil || !slices.Contains(ids, id) {
			t.Fatalf("List = %v, %v; want it to contain %s", ids, err, id)
		}
		if err := e.Destroy(t.Context(), id); err != nil {
			t.Fatalf("destroy: %v", err)
		}
		if err := e.Destroy(t.Context(), id); err != nil {
			t.Fatalf("second destroy: %v, want nil", err)
		}
		ids, _ = e.List(t.Context())
		if slices.Contains(ids, id) {
			t.Fatalf("List after destroy still has %s: %v", id, ids)
		}
		if _, err := e.Attach(t.Context(), engine.Spec{ID: id, RootFS: env.RootFS}); !errdefs.IsNotFound(err) {
			t.Fatalf("attach after destroy: %v, want a not-found error", err)
		}
	})

	t.Run("DestroyUnknown", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		if err := e.Destroy(t.Context(), newID()); err != nil {
			t.Fatalf("destroy of an unknown id: %v, want nil", err)
		}
	})

	t.Run("CreateTwiceSameID", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		id := newID()
		create(t, e, engine.Spec{ID: id})
		if _, err := e.Create(t.Context(), engine.Spec{ID: id, RootFS: env.RootFS, MemoryMiB: 256}); !errdefs.IsAlreadyExists(err) {
			t.Fatalf("second create with the same id: %v, want already-exists", err)
		}
	})

	t.Run("AttachAfterRestart", func(t *testing.T) {
		dir := env.StateDir(t)
		e1 := newEngine(t, dir)
		id := newID()
		spec := engine.Spec{ID: id}
		sb := create(t, e1, spec)
		Exec(t, sb, "sh", "-c", "echo kept > /root/state")
		if err := e1.Close(); err != nil {
			t.Fatal(err)
		}
		e2 := newEngine(t, dir)
		spec.RootFS = env.RootFS
		sb2, err := e2.Attach(t.Context(), spec)
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		if r := Exec(t, sb2, "cat", "/root/state"); r.Stdout != "kept\n" {
			t.Fatalf("after reattach: %+v, want the file written before", r)
		}
		if err := e2.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AttachToAFrozenSandbox", func(t *testing.T) {
		// A restarted daemon that cannot reach a running sandbox in time
		// (frozen here; a loaded host in life) must hear Unavailable, not
		// NotFound: on NotFound it removes the sandbox, the user's work
		// with it.
		dir := env.StateDir(t)
		e1 := newEngine(t, dir)
		spec := engine.Spec{ID: newID()}
		sb := create(t, e1, spec)
		Exec(t, sb, "sh", "-c", "echo kept > /root/state")
		pid := sb.PID()
		if pid <= 0 {
			t.Fatalf("PID() = %d", pid)
		}
		if err := e1.Close(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		thawed := false
		thaw := func() {
			if !thawed {
				thawed = true
				_ = unix.Kill(pid, unix.SIGCONT)
			}
		}
		defer thaw()
		e2 := newEngine(t, dir)
		spec.RootFS = env.RootFS
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		_, err := e2.Attach(ctx, spec)
		cancel()
		if !errdefs.IsUnavailable(err) {
			t.Fatalf("attach to a frozen sandbox: %v, want Unavailable", err)
		}
		thaw()
		sb2, err := e2.Attach(t.Context(), spec)
		if err != nil {
			t.Fatalf("attach once thawed: %v", err)
		}
		if r := Exec(t, sb2, "cat", "/root/state"); r.Stdout != "kept\n" {
			t.Fatalf("after the thawed attach: %+v, want the file written before", r)
		}
		if err := e2.Destroy(t.Context(), spec.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("LoopbackOnlyNetwork", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		sb := create(t, e, engine.Spec{})
		r := Exec(t, sb, "python3", "-c", `
import socket
print(sorted(n for _, n in socket.if_nameindex()))
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("192.0.2.1", 80)); print("connected")
except OSError as e:
    print("refused")
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
c = socket.create_connection(srv.getsockname()); print("loopback ok")
`)
		if r.Exit.Code != 0 || r.Stdout != "['lo']\nrefused\nloopback ok\n" {
			t.Fatalf("network inside: %+v; want only lo, no route out, loopback working", r)
		}
	})

	t.Run("MemoryLimit", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		sb := create(t, e, engine.Spec{MemoryMiB: 128})
		// Touch 400 MiB: more than the limit. Depending on the engine the
		// process or the whole sandbox is killed; either way it must not
		// succeed, and a killed sandbox must say so.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		p, err := sb.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"python3", "-c",
			"b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"}})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(p.Stdout)
		exit, err := p.Wait(ctx)
		if strings.Contains(string(out), "survived") || (err == nil && exit.Code == 0) {
			t.Fatalf("a 400 MiB allocation in a 128 MiB sandbox succeeded: %q %+v", out, exit)
		}
		if err != nil {
			select {
			case <-sb.Exited():
			case <-ctx.Done():
				t.Fatal("the agent connection broke but the sandbox was not reported as exited")
			}
			if sb.ExitReason() == "" {
				t.Fatal("sandbox exited without a reason")
			}
			t.Logf("sandbox killed: %s", sb.ExitReason())
		}
	})

	t.Run("Snapshot", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		snap, ok := e.(engine.Snapshotter)
		if !ok {
			t.Skipf("%s engine cannot snapshot", e.Name())
		}
		restore := func(t *testing.T, spec engine.Spec, dir string) engine.Sandbox {
			t.Helper()
			spec.RootFS, spec.MemoryMiB = env.RootFS, 256
			sb, err := snap.Restore(t.Context(), spec, dir)
			if err != nil {
				t.Fatalf("restore %s: %v", spec.ID, err)
			}
			t.Cleanup(func() { _ = e.Destroy(context.Background(), spec.ID) })
			Reconfigure(t, sb, spec)
			return sb
		}
		parent := create(t, e, engine.Spec{Hostname: "parent"})
		// A background process whose memory holds a counter, and a file.
		Exec(t, parent, "sh", "-c", `echo from-parent > /root/shared
python3 -c '
import time
i = 0
while True:
    i += 1
    open("/tmp/count.tmp", "w").write(str(i)); __import__("os").rename("/tmp/count.tmp", "/tmp/count")
    time.sleep(0.01)
' > /dev/null 2>&1 &
until [ -s /tmp/count ]; do sleep 0.01; done`)
		dir := filepath.Join(env.StateDir(t), "snap")
		if err := snap.Checkpoint(t.Context(), parent.ID(), dir, true); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		if r := Exec(t, parent, "cat", "/root/shared"); r.Stdout != "from-parent\n" {
			t.Fatalf("parent after checkpoint: %+v", r)
		}
		readCount := func(sb engine.Sandbox) int {
			r := Exec(t, sb, "cat", "/tmp/count")
			n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
			if err != nil {
				t.Fatalf("count in %s: %+v", sb.ID(), r)
			}
			return n
		}
		var kids []engine.Sandbox
		for i := range 2 {
			kids = append(kids, restore(t, engine.Spec{ID: newID(), Hostname: fmt.Sprintf("child-%d", i)}, dir))
		}
		var rand []string
		for i, k := range kids {
			before := time.Now().Unix()
			r := Exec(t, k, "sh", "-c", "cat /root/shared; hostname; head -c 16 /dev/urandom | od -An -tx1; date +%s")
			after := time.Now().Unix()
			lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
			if len(lines) != 4 || lines[0] != "from-parent" || lines[1] != fmt.Sprintf("child-%d", i) {
				t.Fatalf("child %d: %+v; want the parent's file and its own hostname", i, r)
			}
			rand = append(rand, lines[2])
			// The guest's date ran while the exec did: between before and
			// after, give or take the clock step's own delay (an exec can
			// take seconds on a loaded host under TCG, which is no clock
			// error).
			if sec, _ := strconv.ParseInt(lines[3], 10, 64); sec < before-3 || sec > after+3 {
				t.Fatalf("child %d clock says %s, host %d to %d while it ran", i, lines[3], before, after)
			}
			// The process running at the snapshot runs on in the child.
			a := readCount(k)
			deadline := time.Now().Add(10 * time.Second)
			for readCount(k) <= a {
				if time.Now().After(deadline) {
					t.Fatalf("child %d: the background counter stopped at %d", i, a)
				}
			}
			Exec(t, k, "sh", "-c", fmt.Sprintf("echo child-%d > /root/own", i))
		}
		if rand[0] == rand[1] {
			t.Fatalf("two children read the same /dev/urandom bytes: %s", rand[0])
		}
		for _, sb := range []engine.Sandbox{parent, kids[1]} {
			if r := Exec(t, sb, "cat", "/root/own"); r.Stdout == "child-0\n" {
				t.Fatalf("%s sees child 0's write", sb.ID())
			}
		}
		if r := Exec(t, parent, "hostname"); r.Stdout != "parent\n" {
			t.Fatalf("parent hostname %q", r.Stdout)
		}
	})

	t.Run("SleepWake", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		snap, ok := e.(engine.Snapshotter)
		if !ok {
			t.Skipf("%s engine cannot snapshot", e.Name())
		}
		id := newID()
		sb := create(t, e, engine.Spec{ID: id, Hostname: "sleeper"})
		Exec(t, sb, "sh", "-c", "echo kept > /root/f")
		dir := filepath.Join(env.StateDir(t), "sleep")
		if err := snap.Checkpoint(t.Context(), id, dir, false); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		select {
		case <-sb.Exited():
			if sb.ExitReason() != "" {
				t.Fatalf("a sandbox stopped by a checkpoint reports an unexpected exit: %s", sb.ExitReason())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("sandbox still running after a checkpoint without leave-running")
		}
		if err := e.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		woke, err := snap.Restore(t.Context(), engine.Spec{ID: id, RootFS: env.RootFS, MemoryMiB: 256, Hostname: "sleeper"}, dir)
		if err != nil {
			t.Fatalf("wake: %v", err)
		}
		// Destroyed before the sleep image's directory goes: a woken
		// microVM may still map its memory from there.
		t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
		if r := Exec(t, woke, "cat", "/root/f"); r.Stdout != "kept\n" {
			t.Fatalf("after wake: %+v", r)
		}
	})

	t.Run("DiskCap", func(t *testing.T) {
		const capMiB = 64
		e := newEngine(t, env.StateDir(t))
		sb := create(t, e, engine.Spec{DiskMiB: capMiB})
		fill := func(t *testing.T, sb engine.Sandbox) {
			t.Helper()
			r := Exec(t, sb, "sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?")
			if !strings.Contains(r.Stdout, "No space left on device") || strings.Contains(r.Stdout, "rc=0") {
				t.Fatalf("writing 200 MiB with a %d MiB disk cap: %+v; want ENOSPC", capMiB, r)
			}
			if env.DiskUsage != nil {
				n := env.DiskUsage(t, e, sb.ID())
				t.Logf("%s: host disk used %d MiB", sb.ID(), n>>20)
				if n > (capMiB+8)<<20 {
					t.Fatalf("the sandbox's writes take %d MiB of host disk; its cap is %d MiB", n>>20, capMiB)
				}
			}
		}
		fill(t, sb)
		r := Exec(t, sb, "sh", "-c", "df -m / | tail -1")
		if f := strings.Fields(r.Stdout); len(f) < 2 || f[1] != strconv.Itoa(capMiB) {
			t.Fatalf("df inside: %+v; want a %d MiB file system", r, capMiB)
		}
		if r := Exec(t, sb, "sh", "-c", "rm /root/fill && echo still-working > /root/f && cat /root/f"); r.Stdout != "still-working\n" {
			t.Fatalf("after filling the disk: %+v", r)
		}
		snap, ok := e.(engine.Snapshotter)
		if !ok {
			return
		}
		dir := filepath.Join(env.StateDir(t), "img")
		if err := snap.Checkpoint(t.Context(), sb.ID(), dir, true); err != nil {
			t.Fatal(err)
		}
		spec := engine.Spec{ID: newID(), RootFS: env.RootFS, MemoryMiB: 256, Hostname: "child", DiskMiB: capMiB}
		kid, err := snap.Restore(t.Context(), spec, dir)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		kidID := spec.ID // spec is reused below
		t.Cleanup(func() {
			if err := e.Destroy(context.Background(), kidID); err != nil {
				t.Errorf("destroy %s: %v", kidID, err)
			}
		})
		if r := Exec(t, kid, "cat", "/root/f"); r.Stdout != "still-working\n" {
			t.Fatalf("child: %+v", r)
		}
		fill(t, kid)

		// A sandbox prepared without a cap and created with one has it.
		prep, ok := e.(engine.Preparer)
		if !ok {
			return
		}
		spec = engine.Spec{ID: newID(), RootFS: env.RootFS, MemoryMiB: 256, Hostname: "prepared"}
		if err := prep.Prepare(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		spec.DiskMiB = capMiB
		fill(t, create(t, e, spec))
	})

	t.Run("SleepOnFullDisk", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		snap, ok := e.(engine.Snapshotter)
		if !ok {
			t.Skipf("%s engine cannot snapshot", e.Name())
		}
		full := smallFS(t, 4) // unmounted after the sandbox is destroyed
		id := newID()
		sb := create(t, e, engine.Spec{ID: id, Hostname: "full"})
		Exec(t, sb, "sh", "-c", "echo kept > /root/f; head -c 16M /dev/urandom > /root/big; sh -c 'echo $$ > /root/bg.pid; exec sleep infinity' > /dev/null 2>&1 &  until [ -s /root/bg.pid ]; do sleep 0.01; done")
		err := snap.Checkpoint(t.Context(), id, filepath.Join(full, "sleep"), false)
		if !errdefs.Is(err, errdefs.ResourceExhausted) || !strings.Contains(err.Error(), "disk") {
			t.Fatalf("checkpoint (stopping) onto a full disk: %v; want a resource-exhausted error that says the disk is full", err)
		}
		t.Logf("checkpoint onto a full disk: %v", err)
		var st unix.Statfs_t
		if err := unix.Statfs(full, &st); err != nil || st.Bfree < st.Blocks*9/10 {
			t.Fatalf("after the failed checkpoint %d of %d blocks are free (%v): its partial image still takes space", st.Bfree, st.Blocks, err)
		}
		select {
		case <-sb.Exited():
			t.Fatalf("the sandbox stopped after a failed checkpoint: %s", sb.ExitReason())
		case <-time.After(time.Second):
		}
		if r := Exec(t, sb, "sh", "-c", "cat /root/f; kill -0 $(cat /root/bg.pid) && echo proc-alive"); r.Stdout != "kept\nproc-alive\n" {
			t.Fatalf("after a failed checkpoint: %+v; want the file and the process still there", r)
		}
		// And it can sleep once there is room.
		dir := filepath.Join(env.StateDir(t), "sleep")
		if err := snap.Checkpoint(t.Context(), id, dir, false); err != nil {
			t.Fatalf("checkpoint with room: %v", err)
		}
		select {
		case <-sb.Exited():
		case <-time.After(10 * time.Second):
			t.Fatal("sandbox still running after a checkpoint without leave-running")
		}
		if err := e.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		woke, err := snap.Restore(t.Context(), engine.Spec{ID: id, RootFS: env.RootFS, MemoryMiB: 256, Hostname: "full"}, dir)
		if err != nil {
			t.Fatalf("wake: %v", err)
		}
		// Destroyed before the sleep image's directory goes: a woken
		// microVM may still map its memory from there.
		t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
		if r := Exec(t, woke, "sh", "-c", "cat /root/f; kill -0 $(cat /root/bg.pid) && echo proc-alive"); r.Stdout != "kept\nproc-alive\n" {
			t.Fatalf("after wake: %+v", r)
		}
	})

	t.Run("Prepare", func(t *testing.T) {
		e := newEngine(t, env.StateDir(t))
		prep, ok := e.(engine.Preparer)
		if !ok {
			t.Skipf("%s engine cannot prepare", e.Name())
		}
		spec := func(host string) engine.Spec {
			return engine.Spec{ID: newID(), RootFS: env.RootFS, MemoryMiB: 256, Hostname: host}
		}
		// Prepared then booted, under another hostname than prepared with.
		s1 := spec("prepared")
		if err := prep.Prepare(t.Context(), s1); err != nil {
			t.Fatalf("prepare: %v", err)
		}
		s1.Hostname = "booted"
		sb := create(t, e, s1)
		Reconfigure(t, sb, s1)
		if r := Exec(t, sb, "hostname"); r.Stdout != "booted\n" {
			t.Fatalf("prepared then created: %+v", r)
		}
		// Prepared, never used, destroyed.
		s2 := spec("unused")
		if err := prep.Prepare(t.Context(), s2); err != nil {
			t.Fatal(err)
		}
		if err := e.Destroy(t.Context(), s2.ID); err != nil {
			t.Fatalf("destroy a prepared sandbox: %v", err)
		}
		if ids, _ := e.List(t.Context()); slices.Contains(ids, s2.ID) {
			t.Fatalf("a destroyed prepared sandbox is still listed")
		}
		// Prepared, then a checkpoint restored into it.
		snap, ok := e.(engine.Snapshotter)
		if !ok {
			return
		}
		Exec(t, sb, "sh", "-c", "echo from-source > /root/f")
		dir := filepath.Join(env.StateDir(t), "img")
		if err := snap.Checkpoint(t.Context(), sb.ID(), dir, true); err != nil {
			t.Fatal(err)
		}
		s3 := spec("restored")
		if err := prep.Prepare(t.Context(), s3); err != nil {
			t.Fatal(err)
		}
		kid, err := snap.Restore(t.Context(), s3, dir)
		if err != nil {
			t.Fatalf("restore into a prepared sandbox: %v", err)
		}
		t.Cleanup(func() { _ = e.Destroy(context.Background(), s3.ID) })
		Reconfigure(t, kid, s3)
		if r := Exec(t, kid, "sh", "-c", "cat /root/f; hostname"); r.Stdout != "from-source\nrestored\n" {
			t.Fatalf("restored into a prepared sandbox: %+v", r)
		}
	})
}
