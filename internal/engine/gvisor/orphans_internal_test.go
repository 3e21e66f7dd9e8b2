package gvisor

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestOwnedBy(t *testing.T) {
	const root, dir, id = "/d/gvisor/runsc", "/d/gvisor/sandboxes/0123456789abcdef", "0123456789abcdef"
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"runsc restore", []string{"runsc", "--root", root, "--overlay2", "root:dir=/enc/upper/" + id, "restore", "--image-path", "/img", "--bundle", dir, id}, true},
		{"gofer", []string{"runsc-gofer", "--root=" + root, "gofer", "--bundle", dir, "--spec-fd=3", id}, true},
		{"sandbox", []string{"runsc-sandbox", "--root=" + root, "boot", "--bundle=" + dir, "--controller-fd=11", id}, true},
		{"the directory only", []string{"runsc", "--pid-file", dir + "/pid", "something"}, true},
		{"upper in the directory", []string{"runsc", "--overlay2", "root:dir=" + dir + "/upper", "x"}, true},
		{"another daemon's root", []string{"runsc-sandbox", "--root=/e/gvisor/runsc", "boot", "--bundle=/e/gvisor/sandboxes/" + id, id}, false},
		{"a root that only starts alike", []string{"runsc", "--root=" + root + "2", "state", id}, false},
		{"another id", []string{"runsc", "--root", root, "state", "0123456789abcdee"}, false},
		{"a longer id's directory", []string{"runsc", "--root", root, "--bundle", dir + "0", "0123456789abcdef0"}, false},
		{"the id, not last", []string{"runsc", "--root", root, "state", id, "x"}, false},
		{"--root at the end", []string{"runsc", "--root"}, false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ownedBy(tc.args, root, dir, id); got != tc.want {
				t.Fatalf("ownedBy(%q) = %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}

// fakeProcess starts a process whose command line is args (the test
// binary, blocking until killed: see TestMain), as a stand-in for one of
// runsc's; it is reaped when it dies.
func fakeProcess(t *testing.T, args ...string) (pid int, dead <-chan struct{}) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: exe, Args: args, Env: append(os.Environ(), FakeProcessEnv+"=1")}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	// Until its command line is the one given (exec has happened).
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cmdline"))
		if strings.Contains(string(b), args[len(args)-1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fake process never showed its command line: %q", b)
		}
		time.Sleep(5 * time.Millisecond) // polling /proc until it execs
	}
	return cmd.Process.Pid, done
}

func isDead(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

// TestStartEndsOrphans: a daemon killed while `runsc restore` of a
// sandbox ran left that restore (and the gofer and sandbox processes it
// started) running, orphaned. Restoring the id again must end them first,
// and only them: a process of the same id under another daemon's runsc
// root lives on.
func TestStartEndsOrphans(t *testing.T) {
	dir := testenv.TempDir(t)
	id := "orphan0000000001"
	e, spec, _ := startSandbox(t, dir, id)
	t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
	image := filepath.Join(dir, "image")
	if err := e.Checkpoint(t.Context(), id, image, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	sbDir := e.dir(id)
	// As `runsc restore` and the processes it starts name themselves.
	_, restore := fakeProcess(t, "runsc", "--root", e.runRoot, "--network", "none", "restore", "--image-path", image, "--bundle", sbDir, "--detach", id)
	_, gofer := fakeProcess(t, "runsc-gofer", "--root="+e.runRoot, "gofer", "--bundle", sbDir, "--spec-fd=3", id)
	_, boot := fakeProcess(t, "runsc-sandbox", "--root="+e.runRoot, "boot", "--bundle="+sbDir, "--controller-fd=11", id)
	otherRoot := filepath.Join(testenv.TempDir(t), "gvisor", "runsc")
	_, other := fakeProcess(t, "runsc-sandbox", "--root="+otherRoot, "boot", "--bundle="+filepath.Join(filepath.Dir(otherRoot), "sandboxes", id), id)

	sb, err := e.Restore(t.Context(), spec, image)
	if err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan struct{}{"restore": restore, "gofer": gofer, "sandbox": boot} {
		if !isDead(ch, 10*time.Second) {
			t.Errorf("the orphaned %s process still runs after the restore", name)
		}
	}
	if isDead(other, 0) {
		t.Error("another daemon's process of the same id was killed")
	}
	if r := enginetest.Exec(t, sb, "echo", "restored"); r.Stdout != "restored\n" {
		t.Fatalf("exec in the restored sandbox: %+v", r)
	}
}

// TestRestoreOverAStaleControlSocket: an orphaned restore killed after
// runsc bound the sandbox's control socket, before it recorded the
// sandbox, leaves runsc-<id>.sock in runsc's root bound to nobody. The
// next restore of the id found it taken and bound its own under /var/run;
// the engine, which dials the one in its root, then failed every
// checkpoint with "control socket: connection refused"
// (TestVolumeSnapshotDaemonKill/gvisor-restore-started under load).
func TestRestoreOverAStaleControlSocket(t *testing.T) {
	dir := testenv.TempDir(t)
	id := "staleso000000001"
	e, spec, _ := startSandbox(t, dir, id)
	t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
	image := filepath.Join(dir, "image")
	if err := e.Checkpoint(t.Context(), id, image, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	// What the killed orphan leaves: a socket file nobody listens on.
	ln, err := net.Listen("unix", e.controlSocket(id))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := net.Dial("unix", e.controlSocket(id)); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("dialing the stale socket: %v, want connection refused", err)
	}
	sb, err := e.Restore(t.Context(), spec, image)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Checkpoint(t.Context(), id, filepath.Join(dir, "image2"), true); err != nil {
		t.Fatalf("a checkpoint after a restore over a stale control socket: %v", err)
	}
	if r := enginetest.Exec(t, sb, "echo", "still"); r.Stdout != "still\n" {
		t.Fatalf("exec after the checkpoint: %+v", r)
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{e.controlSocket(id), filepath.Join("/var/run", "runsc-"+id+".sock")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s after Destroy: %v, want it gone", p, err)
		}
	}
}

// TestDestroyEndsOrphansOfAGoneDirectory: Destroy of an id whose
// directory is gone still ends its processes, found by root and id even
// when their command line does not name the directory with a slash after
// it (the gofer's --bundle DIR, the sandbox's --bundle=DIR; the upper
// layer elsewhere, as with encryption at rest).
func TestDestroyEndsOrphansOfAGoneDirectory(t *testing.T) {
	dir := testenv.TempDir(t)
	fake := filepath.Join(dir, "fake-binary")
	if err := os.WriteFile(fake, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{StateDir: filepath.Join(dir, "state"), Runsc: fake, AgentPath: fake, UpperRoot: filepath.Join(dir, "upper")})
	if err != nil {
		t.Fatal(err)
	}
	id := "gonedir000000001"
	_, boot := fakeProcess(t, "runsc-sandbox", "--root="+e.runRoot, "--overlay2=root:dir="+e.upper(id), "boot", "--bundle="+e.dir(id), id)
	_, gofer := fakeProcess(t, "runsc-gofer", "--root="+e.runRoot, "gofer", "--bundle", e.dir(id), id)
	// A socket left in runsc's root.
	if err := os.WriteFile(e.controlSocket(id), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if !isDead(boot, 10*time.Second) || !isDead(gofer, 10*time.Second) {
		t.Fatal("Destroy left a process of the id running")
	}
	if _, err := os.Lstat(e.controlSocket(id)); !os.IsNotExist(err) {
		t.Fatalf("the control socket after Destroy: %v, want it gone", err)
	}
}
