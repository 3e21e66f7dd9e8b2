package e2b_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// jsDir holds the pinned E2B SDKs (package-lock.json; `npm ci` installs
// them, .ci/run does) and the script that drives them.
func jsDir(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the E2B compatibility test drives the real E2B JS SDK (install Node >= 20)")
	}
	dir := filepath.Join(testenv.ModuleRoot(), "internal", "front", "e2b", "testdata", "js")
	for _, m := range sdkModules {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", m, "package.json")); err != nil {
			t.Fatalf("the E2B SDK %s is not installed in %s: run `make deps-test` (`make test` does) (%v)", m, dir, err)
		}
	}
	return dir
}

// startE2B starts a daemon serving the E2B front and returns the base URL
// and the API key. The tests that call it run in parallel (t.Parallel: two
// at a time, go test's -parallel on two cores): each has a daemon, ports
// and sandboxes of its own, and much of a test is waiting (on node, a
// sandbox's timeout, the 5 s metrics samples) that another's work fills.
func startE2B(t testing.TB, extraArgs ...string) (*testenv.Daemon, string, string) {
	t.Helper()
	testenv.RequireRoot(t)
	key := "e2b-test-key-0123456789"
	tmp, err := os.MkdirTemp("", "clade-e2b-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	tok := filepath.Join(tmp, "token")
	if err := os.WriteFile(tok, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	// The tests run `base` on clade's lean default image unless they ask
	// for another (a later --e2b-base-image wins): TestBaseTemplate checks
	// the e2b-base image itself.
	d := testenv.StartDaemon(t, append([]string{"--e2b", addr, "--token-file", tok, "--e2b-base-image", "default"}, extraArgs...)...)
	return d, "http://" + addr, key
}

// TestRealSDK runs the unmodified E2B JS SDK, at each pinned version,
// through every call clade's E2B front serves, against real sandboxes.
func TestRealSDK(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	ingress, domain := freeAddr(t), "clade.localhost"
	d, url, key := startE2B(t, "--ingress", ingress, "--ingress-domain", domain)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) {
			runJS(t, d, url, key, 5*time.Minute, "compat.mjs", mod, "CLADE_INGRESS_ADDR="+ingress, "CLADE_INGRESS_DOMAIN="+domain)
		})
	}
}

// sdkModules are the pinned E2B JS clients (package.json) the scripts run
// with: the newest and the one before.
var sdkModules = []string{"e2b", "e2b-2.50"}

// runJS runs `node SCRIPT ARG` in jsDir against the E2B front at url
// (E2B_API_URL and E2B_SANDBOX_URL) with key and env added, and fails the
// test, with what the script printed and the tail of d's log, unless it
// ends well having printed "PASS ARG". ARG names the SDK module the script
// loads (or, for a script of one module, its own tag).
func runJS(t *testing.T, d *testenv.Daemon, url, key string, timeout time.Duration, script, arg string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, arg)
	cmd.Dir = jsDir(t)
	cmd.Env = append(append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url), env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "PASS "+arg) {
		t.Fatalf("node %s %s failed against clade: %v\ndaemon log tail:\n%s", script, arg, err, tail(d.Log(), 3000))
	}
}

// freeAddr returns a loopback address with a free port: listen, note,
// close; the daemon takes it a moment later.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
