package e2b_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/front/e2b"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestBaseTemplate runs the unmodified E2B SDK against the `base` template
// on the e2b-base image: the tools E2B's base holds, the user `user` with
// passwordless sudo, and /home/user as the working directory.
func TestBaseTemplate(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	testenv.BuiltinImage(t, image.E2BBase)
	// A hot pool of E2B's base image only (--e2b keeps it hot beside the
	// default image's): the SDK's create must claim one of them.
	d, url, key := startE2B(t, "--e2b-base-image", image.E2BBase, "--hot-pool", "default=0,"+image.E2BBase+"=1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitHot(ctx, t, d, 1)
	runJS(t, d, url, key, 3*time.Minute, "base.mjs", "e2b")
	if h := metric(t, d, "clade_hot_pool_hits_total"); h < 1 {
		t.Fatalf("the create of `base` claimed no hot sandbox of %s (%d hot-pool hits)", image.E2BBase, h)
	}

	// e2b-base holds E2B's account: once a create found it there, later
	// creates of the image run nothing in the sandbox (no account setup,
	// the sandbox is ready as created) and still serve the user.
	for range 2 {
		var sb struct{ SandboxID string }
		if st, _ := rest(t, "POST", url+"/v2/sandboxes", key, map[string]any{"templateID": "base", "timeout": 77}, &sb); st != http.StatusCreated {
			t.Fatalf("create: %d", st)
		}
		t.Cleanup(func() { d.Client.DeleteSandbox(context.Background(), sb.SandboxID) })
		got, err := d.Client.GetSandbox(ctx, sb.SandboxID)
		if err != nil || got.TimeoutMS != 77_000 || got.ExpiresAt == nil || time.Until(*got.ExpiresAt) > 77*time.Second || time.Until(*got.ExpiresAt) < 30*time.Second {
			t.Fatalf("sandbox %s: timeout %d ms ending %v (%v), want 77 s from the create", sb.SandboxID, got.TimeoutMS, got.ExpiresAt, err)
		}
		events, err := d.Client.Events(ctx, sdk.EventFilter{Sandbox: sb.SandboxID})
		if err != nil {
			t.Fatal(err)
		}
		for e, err := range events {
			if err != nil {
				t.Fatal(err)
			}
			if e.Type == api.EventExecStarted {
				t.Fatalf("the create of sandbox %s ran %+v in it: a root known to hold the account needs no setup", sb.SandboxID, e.Exec)
			}
		}
		var out strings.Builder
		st, err := d.Client.Exec(ctx, sb.SandboxID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "id -un; echo $HOME; stat -c %U " + e2b.Home}, User: e2b.DefaultUser, Stdout: &out})
		if err != nil || st.Code != 0 || out.String() != "user\n/home/user\nuser\n" {
			t.Fatalf("exec as user in %s: %q %+v %v", sb.SandboxID, out.String(), st, err)
		}
	}
}

// waitHot waits (bounded by ctx) until the daemon's hot pool holds n
// started sandboxes.
func waitHot(ctx context.Context, t testing.TB, d *testenv.Daemon, n int) {
	t.Helper()
	for {
		h, err := d.Client.Health(ctx)
		if err == nil && h.Hot >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the hot pool never held %d sandboxes (%+v, %v)\ndaemon log tail:\n%s", n, h, err, tail(d.Log(), 3000))
		case <-time.After(20 * time.Millisecond): // polling the pool's background start
		}
	}
}

// metric reads a counter from the daemon's /metrics.
func metric(t testing.TB, d *testenv.Daemon, name string) int {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.Socket)
	}}}
	resp, err := hc.Get("http://clade/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, v)
			}
			return int(n)
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
