// Package testenv gives clade's integration tests what they need from the
// machine: runsc, the clade binaries, the default image, root, and a real
// daemon to talk to. A test skips only when a requirement is truly absent
// and CI is not set; in CI a missing requirement fails the test, so CI can
// never go green by skipping.
package testenv

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/sdk"
)

// missing skips, or fails in CI, for an absent requirement.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: requirements must be installed, see .ci/run)", msg)
	}
	t.Skip(msg)
}

// RequireRoot skips unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "needs root (runsc, cgroups)")
	}
}

// Slow marks a test too long for `make test` (a soak, a kill loop, a
// sweep): it runs only with $CLADE_TEST_SLOW set, which `make test-slow`
// sets, and CI runs that too. The Makefile's SLOW_TESTS must name it
// (TestSlowTestsListed checks).
func Slow(t testing.TB) {
	t.Helper()
	if os.Getenv("CLADE_TEST_SLOW") == "" {
		t.Skip("a long test: `make test-slow` runs it (CI does), or set CLADE_TEST_SLOW=1")
	}
}

// ModuleRoot returns the repository root.
func ModuleRoot() string {
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil && !strings.Contains(d, "/tools/") {
			return d
		}
	}
	return dir
}

// Runsc returns the runsc binary: $CLADE_RUNSC, bin/runsc, then $PATH.
func Runsc(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	for _, p := range []string{os.Getenv("CLADE_RUNSC"), filepath.Join(ModuleRoot(), "bin", "runsc")} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	missing(t, "runsc not found: run `make deps`")
	return ""
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries builds clade and clade-agent once per test process and returns
// their paths. $CLADE_TEST_BIN names a directory holding both, built from
// this tree already: `make test` builds them once for every package's
// test process rather than each linking its own (seconds of CPU each).
func Binaries(t testing.TB) (clade, agent string) {
	t.Helper()
	if dir := os.Getenv("CLADE_TEST_BIN"); dir != "" {
		clade, agent = filepath.Join(dir, "clade"), filepath.Join(dir, "clade-agent")
		for _, p := range []string{clade, agent} {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("$CLADE_TEST_BIN: %v (unset it to build the binaries here)", err)
			}
		}
		return clade, agent
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "clade-test-bin")
		if buildErr != nil {
			return
		}
		for _, pkg := range []string{"clade", "clade-agent"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, pkg), "./cmd/"+pkg)
			cmd.Dir = ModuleRoot()
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "clade"), filepath.Join(binDir, "clade-agent")
}

// Cleanup removes what Binaries built; call it from TestMain after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

var (
	imageOnce sync.Once
	imageErr  error
)

// ImagesDir returns a shared image directory holding the default image,
// building it once (a few minutes) if missing. $CLADE_TEST_IMAGES overrides
// /var/cache/clade/images.
func ImagesDir(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	dir := os.Getenv("CLADE_TEST_IMAGES")
	if dir == "" {
		dir = "/var/cache/clade/images"
	}
	imageOnce.Do(func() {
		st, err := image.NewStore(dir, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		if err != nil {
			imageErr = err
			return
		}
		imageErr = st.EnsureDefault(context.Background())
	})
	if imageErr != nil {
		if _, err := exec.LookPath("debootstrap"); err != nil {
			missing(t, "default image missing and debootstrap not installed: run `make deps`")
		}
		t.Fatalf("default image: %v", imageErr)
	}
	return dir
}

// TempDir returns a short temporary directory (unix socket paths inside it
// must stay under 108 bytes), removed at the end of the test.
func TempDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "clade")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A sandbox's runsc processes (its root, bundle and logs are in
		// here) must be gone by now: whatever a test left running is a
		// leak, and is killed so that it outlives neither the test nor
		// its directory.
		if left := ReapProcesses(d); len(left) > 0 {
			t.Errorf("processes of %s still running at the end of the test (killed):\n  %s", d, strings.Join(left, "\n  "))
		}
		// runsc leaves its shared null netns mounted under its root.
		_ = exec.Command("sh", "-c", "grep -o ' "+d+"[^ ]*' /proc/self/mountinfo | xargs -r -n1 umount -l").Run()
		os.RemoveAll(d)
	})
	return d
}

// ReapProcesses SIGKILLs the processes whose command line mentions dir
// (ProcessesMentioning: runsc's sandbox, gofer and commands under a data
// dir; a daemon too) and waits, up to 10 s, until they are gone. It
// returns what it killed, "pid cmdline".
func ReapProcesses(dir string) []string {
	var killed []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := processesMentioning(dir, true)
		if len(left) == 0 || time.Now().After(deadline) {
			return killed
		}
		for _, p := range left {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				if syscall.Kill(pid, syscall.SIGKILL) == nil && !slices.Contains(killed, p) {
					killed = append(killed, p)
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // polling /proc until the kills land
	}
}

// Daemon is a clade daemon process run by a test.
type Daemon struct {
	t       testing.TB
	Bin     string
	DataDir string
	Socket  string
	Client  *sdk.Client
	// Net is the daemon's own network share (prefix and range).
	Net     NetPlan
	args    []string
	env     []string
	cmd     *exec.Cmd
	logPath string
	waitErr chan error
	// Wrap, when set, is put before the daemon's command line (e.g.
	// nsenter --net=NS to run it in a network namespace of the test's).
	Wrap []string
	// NetNS is the network namespace the daemon runs in (through Wrap),
	// if not the host's: the leak census looks for its links and its
	// nftables table there.
	NetNS string
}

// StartDaemon starts `clade daemon` on a fresh data dir. At the end of the
// test it removes every sandbox, stops the daemon and fails the test if
// anything leaked (runsc processes, mounts, files).
func StartDaemon(t testing.TB, extraArgs ...string) *Daemon {
	t.Helper()
	d := NewDaemon(t, extraArgs...)
	d.Start(nil)
	return d
}

// StartDaemonOn is StartDaemon on a network share the test took itself
// (ReserveNet): one it holds until cleanups registered before it ran.
func StartDaemonOn(t testing.TB, net NetPlan, extraArgs ...string) *Daemon {
	t.Helper()
	d := newDaemon(t, net, extraArgs...)
	d.Start(nil)
	return d
}

// NewDaemon is StartDaemon without the start: the test sets Wrap, then
// Start, or Launch and WaitReady (to start several daemons at once, such
// as the members of one etcd, which answer only together).
func NewDaemon(t testing.TB, extraArgs ...string) *Daemon {
	t.Helper()
	return newDaemon(t, NetPlan{}, extraArgs...)
}

// newDaemon is NewDaemon on net (a share of its own when net is zero).
func newDaemon(t testing.TB, net NetPlan, extraArgs ...string) *Daemon {
	t.Helper()
	runsc := Runsc(t)
	images := ImagesDir(t)
	clade, agent := Binaries(t)
	dir := TempDir(t)
	if net.Prefix == "" {
		net = ReserveNet(t)
	}
	d := &Daemon{t: t, Bin: clade, DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "clade.sock"), logPath: filepath.Join(dir, "daemon.log"),
		Net: net}
	d.args = append([]string{"daemon", "--data-dir", d.DataDir, "--images-dir", images, "--socket", d.Socket,
		"--runsc", runsc, "--agent", agent, "--build-default-image=false", "--log-level", "debug",
		// No background work unless a test asks for it: the pool's prepared
		// sandboxes would show in the leak census taken mid-test.
		"--warm-pool", "0", "--hot-pool", "0",
		// A network share of its own; no DNS leaves the machine unless a
		// test points --dns-upstream at its test host.
		"--network-prefix", d.Net.Prefix, "--network-range", d.Net.Range.String(), "--network-pool", "2", "--dns-upstream", "none"}, extraArgs...)
	c, err := sdk.New(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	d.Client = c
	t.Cleanup(d.cleanup)
	return d
}

// Start (re)starts the daemon process with extra environment variables and
// waits until it answers.
func (d *Daemon) Start(env []string) {
	d.t.Helper()
	if err := d.Launch(env); err != nil {
		d.t.Fatal(err)
	}
	if err := d.WaitReady(60 * time.Second); err != nil {
		d.t.Fatal(err)
	}
}

// Launch starts the daemon process and returns without waiting for it
// to answer (WaitReady does). Neither calls t.Fatal: they may run on
// goroutines of the test's.
func (d *Daemon) Launch(env []string) error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	d.env = env
	argv := append(append([]string{}, d.Wrap...), d.Bin)
	d.cmd = exec.Command(argv[0], append(argv[1:], d.args...)...)
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return err
	}
	d.waitErr = make(chan error, 1)
	go func(cmd *exec.Cmd, ch chan error) { ch <- cmd.Wait() }(d.cmd, d.waitErr)
	return nil
}

// WaitReady waits until the launched daemon answers, or says why not.
func (d *Daemon) WaitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		if _, err := d.Client.Health(ctx); err == nil {
			return nil
		}
		select {
		case err := <-d.waitErr:
			d.waitErr <- err
			return fmt.Errorf("daemon exited at start: %v\n%s", err, d.Log())
		case <-ctx.Done():
			return fmt.Errorf("daemon did not answer within %s\n%s", timeout, d.Log())
		case <-time.After(20 * time.Millisecond): // polling the socket until it answers
		}
	}
}

// SetArgs appends daemon flags for the next Start (a later flag wins over
// an earlier one), e.g. to restart it with another --engine.
func (d *Daemon) SetArgs(extra ...string) { d.args = append(d.args, extra...) }

// Pid is the daemon process's id (for its /proc entries).
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Wait waits for the daemon process to exit (e.g. after a crash point).
func (d *Daemon) Wait() error {
	select {
	case err := <-d.waitErr:
		d.waitErr <- err
		return err
	case <-time.After(2 * time.Minute):
		d.t.Fatalf("daemon did not exit\n%s", d.Log())
		return nil
	}
}

// Kill sends SIGKILL to the daemon and waits for it to die.
func (d *Daemon) Kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	_ = d.Wait()
}

// Stop asks the daemon to exit (SIGTERM) and waits for it: what it gives
// back on a clean exit (its pools) is gone after.
func (d *Daemon) Stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
}

// Log returns the daemon's log so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// Exited reports whether the daemon process has ended.
func (d *Daemon) Exited() bool { return d.cmd.ProcessState != nil }

func (d *Daemon) cleanup() {
	if d.cmd != nil && d.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if sbs, err := d.Client.ListSandboxes(ctx); err == nil {
			for _, sb := range sbs {
				if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
					d.t.Errorf("cleanup: remove %s: %v", sb.ID, err)
				}
			}
		}
		if snaps, err := d.Client.ListSnapshots(ctx); err == nil {
			for _, sn := range snaps {
				if err := d.Client.DeleteSnapshot(ctx, sn.ID); err != nil {
					d.t.Errorf("cleanup: remove snapshot %s: %v", sn.ID, err)
				}
			}
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.Wait()
	}
	leaks := append(Leaks(d.DataDir), d.Net.NetLeaksIn(d.NetNS)...)
	if len(leaks) > 0 {
		d.t.Errorf("leaked after the test:\n  %s\ndaemon log:\n%s", strings.Join(leaks, "\n  "), tailString(d.Log(), 4000))
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// MountsUnder lists the mount points under dir, but runsc's shared null
// netns (it stays mounted under its root).
func MountsUnder(dir string) []string {
	var mounts []string
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir) && !strings.HasSuffix(fields[4], "/null-netns") {
			mounts = append(mounts, fields[4])
		}
	}
	return mounts
}

// Leaks lists what sandboxes of a data dir still hold: runsc processes,
// mounts (other than runsc's shared null netns), sandbox directories,
// cgroups and network slots (a running daemon's pool of unowned slots is
// not a leak; NetPlan.NetLeaks finds everything once it stopped).
func Leaks(dataDir string) []string {
	var leaks []string
	for _, p := range ProcessesMentioning(dataDir) {
		leaks = append(leaks, "process: "+p)
	}
	for _, m := range MountsUnder(dataDir) {
		leaks = append(leaks, "mount: "+m)
	}
	// With every sandbox and snapshot removed, their files must be gone.
	for _, sub := range []string{"snapshots", "sleep"} {
		ents, _ := os.ReadDir(filepath.Join(dataDir, sub))
		for _, e := range ents {
			leaks = append(leaks, sub+": "+e.Name())
		}
	}
	// A held network slot is recorded by its index, holding its owner.
	slots, _ := os.ReadDir(filepath.Join(dataDir, "network"))
	for _, e := range slots {
		owner, _ := os.ReadFile(filepath.Join(dataDir, "network", e.Name()))
		leaks = append(leaks, "network slot: "+e.Name()+" held by "+string(owner))
	}
	ents, _ := os.ReadDir(filepath.Join(dataDir, "gvisor", "sandboxes"))
	for _, e := range ents {
		leaks = append(leaks, "sandbox dir: "+e.Name())
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/clade", e.Name())); err == nil {
			leaks = append(leaks, "cgroup: "+e.Name())
		}
	}
	return leaks
}

// ProcessesMentioning returns "pid cmdline" of processes whose command line
// contains s.
func ProcessesMentioning(s string) []string { return processesMentioning(s, false) }

// processesMentioning is ProcessesMentioning, with daemons too if daemons.
func processesMentioning(s string, daemons bool) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' || e.Name() == fmt.Sprint(os.Getpid()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if !daemons && strings.Contains(cmd, " daemon --data-dir") {
			continue // the daemon itself is not a sandbox leak
		}
		out = append(out, e.Name()+" "+cmd)
	}
	return out
}

var builtinMu sync.Mutex

// BuiltinImage makes sure the image directory ImagesDir returns also holds
// the built-in image name (see image.RegisterRecipe), building it once (a
// few minutes) if missing, and returns the directory. The recipe's package
// must be linked into the test binary.
func BuiltinImage(t testing.TB, name string) string {
	t.Helper()
	dir := ImagesDir(t)
	builtinMu.Lock()
	defer builtinMu.Unlock()
	st, err := image.NewStore(dir, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatalf("image store: %v", err)
	}
	if err := st.EnsureBuiltin(context.Background(), name); err != nil {
		t.Fatalf("built-in image %s: %v", name, err)
	}
	return dir
}

// AwaitExec waits until an exec of `true` in sandbox id succeeds, as a
// client does after a daemon restart: until the daemon has reattached the
// sandbox (in the background when `runsc state` is slow) and its agent has
// dialled back in, it answers Unavailable ("retry"), which is no lost
// sandbox. Any other error, or no success within 2 minutes, fails t.
func AwaitExec(t testing.TB, c *sdk.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := c.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"true"}})
		if err == nil {
			return
		}
		if !sdk.IsUnavailable(err) || time.Now().After(deadline) {
			t.Fatalf("exec in %s after the restart: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond) // polling: the reattach and the agent's dial-in send no event a client can wait on
	}
}
