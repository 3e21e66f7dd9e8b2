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
	for _, m := range []string{"e2b", "e2b-2.50"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", m, "package.json")); err != nil {
			t.Fatalf("the E2B SDK %s is not installed in %s: run `make deps-test` (`make test` does) (%v)", m, dir, err)
		}
	}
	return dir
}

// startE2B starts a daemon serving the E2B front and returns the base URL
// and the API key.
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
	dir := jsDir(t)
	ingress, domain := freeAddr(t), "clade.localhost"
	d, url, key := startE2B(t, "--ingress", ingress, "--ingress-domain", domain)
	for _, mod := range []string{"e2b", "e2b-2.50"} {
		t.Run(mod, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "compat.mjs", mod)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url,
				"CLADE_INGRESS_ADDR="+ingress, "CLADE_INGRESS_DOMAIN="+domain)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !strings.Contains(string(out), "PASS "+mod) {
				t.Fatalf("the E2B SDK %s failed against clade: %v\ndaemon log tail:\n%s", mod, err, tail(d.Log(), 3000))
			}
		})
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
