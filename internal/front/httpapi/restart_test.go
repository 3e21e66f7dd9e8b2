package httpapi_test

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestRestart kills the daemon with SIGKILL and checks that the next one
// reattaches: exec works again and state is intact.
func TestRestart(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "survivor"})
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo before > /root/f; sleep 1000 > /dev/null 2>&1 &"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	d.Kill()
	d.Start(nil)
	got, err := c.GetSandbox(t.Context(), "survivor")
	if err != nil || got.State != "running" {
		t.Fatalf("after restart: %+v %v, want running", got, err)
	}
	testenv.AwaitExec(t, c, sb.ID)
	r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; pgrep -c sleep || ls /proc | grep -c '^[0-9]'"}})
	if r.err != nil || !strings.HasPrefix(r.stdout, "before\n") {
		t.Fatalf("exec after restart: %+v, want the file written before", r)
	}
}

// TestCrashPoints kills the daemon at each point of a create and a remove,
// restarts it, and checks that the sandbox is either whole and listed or
// gone without a trace.
func TestCrashPoints(t *testing.T) {
	t.Parallel() // its subtests, a daemon each: see TestMain
	for _, tc := range []struct {
		point string
		// create reports whether the crash is in a create (else a remove).
		create bool
	}{
		{"create-before-engine", true},
		{"create-after-engine", true},
		{"destroy-before-engine", false},
		{"destroy-after-engine", false},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel() // a daemon of its own: see TestMain
			d := testenv.StartDaemon(t)
			c := d.Client
			var keep sdk.Sandbox
			if !tc.create {
				keep = newSandbox(t, c, sdk.CreateSandboxRequest{})
			}
			d.Kill()
			d.Start([]string{"CLADE_CRASH_AT=" + tc.point})
			var err error
			if tc.create {
				_, err = c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{})
			} else {
				err = c.DeleteSandbox(context.Background(), keep.ID)
			}
			if err == nil {
				t.Fatal("the request succeeded; the daemon should have crashed in it")
			}
			_ = d.Wait()
			d.Start(nil)
			sbs, err := c.ListSandboxes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(sbs) != 0 {
				t.Fatalf("after restart: %+v, want no sandboxes (half-done work is rolled back or finished)", sbs)
			}
			if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
				t.Fatalf("leaks after reconcile (no sandbox or snapshot is left): %v\n%s", leaks, d.Log())
			}
			// The daemon still works.
			sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
			if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"true"}}); r.err != nil || r.st.Code != 0 {
				t.Fatalf("exec after recovery: %+v", r)
			}
		})
	}
}

// TestSandboxCannotReachDaemon checks that code in a sandbox sees neither the
// daemon's socket nor its TCP port.
func TestSandboxCannotReachDaemon(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	dir := testenv.TempDir(t)
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "secret-token")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := testenv.StartDaemon(t, "--listen", addr, "--token-file", tok)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	_, port, _ := net.SplitHostPort(addr)
	r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c", `
import socket, sys, os
res = []
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1]); res.append("unix-open")
except OSError:
    res.append("unix-closed")
t = socket.socket(); t.settimeout(2)
try:
    t.connect(("127.0.0.1", int(sys.argv[2]))); res.append("tcp-open")
except OSError:
    res.append("tcp-closed")
res.append("datadir-visible" if os.path.exists(sys.argv[3]) else "datadir-hidden")
print(" ".join(res))
`, d.Socket, port, d.DataDir}})
	if r.err != nil || r.stdout != "unix-closed tcp-closed datadir-hidden\n" {
		t.Fatalf("from inside the sandbox: %+v; want the daemon unreachable", r)
	}
	// The TCP API itself wants the token.
	tc, err := sdk.New("http://"+addr, sdk.WithToken("wrong"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.ListSandboxes(t.Context()); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("TCP API with a wrong token: %v, want refused", err)
	}
	tc, _ = sdk.New("http://"+addr, sdk.WithToken("secret-token"))
	if sbs, err := tc.ListSandboxes(t.Context()); err != nil || len(sbs) != 1 {
		t.Fatalf("TCP API with the token: %v %v", sbs, err)
	}
}

// TestHotClaimCrashPoints kills the daemon inside a claim from the hot
// pool, before and after the claim's hooks (its one store write comes
// after both): the restart must find no sandbox and destroy the hot
// sandbox the claim had taken, keeping nothing it started.
func TestHotClaimCrashPoints(t *testing.T) {
	t.Parallel() // its subtests, a daemon each: see TestMain
	for _, point := range []string{"create-before-engine", "create-after-engine"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel() // a daemon of its own: see TestMain
			d := testenv.StartDaemon(t, "--hot-pool", "1")
			c := d.Client
			waitHot(t, c)
			hot := testenv.ProcessesMentioning(d.DataDir)
			if len(hot) == 0 {
				t.Fatal("the hot pool holds a sandbox but no process mentions the data dir")
			}
			d.Kill()
			d.Start([]string{"CLADE_CRASH_AT=" + point})
			waitHot(t, c)
			hot = testenv.ProcessesMentioning(d.DataDir)
			if _, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Name: "claimed"}); err == nil {
				t.Fatal("the claim succeeded; the daemon should have crashed in it")
			}
			_ = d.Wait()
			d.Start(nil)
			sbs, err := c.ListSandboxes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(sbs) != 0 {
				t.Fatalf("after restart: %+v, want no sandboxes (the claim was not recorded)", sbs)
			}
			for _, p := range testenv.ProcessesMentioning(d.DataDir) {
				if slices.Contains(hot, p) {
					t.Fatalf("after restart the hot sandbox of the cut claim still runs: %s\n%s", p, d.Log())
				}
			}
			// The daemon still claims.
			waitHot(t, c)
			sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "claimed"})
			if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"hostname"}}); r.err != nil || r.stdout != "claimed\n" {
				t.Fatalf("exec after recovery: %+v, want the claim's hostname", r)
			}
		})
	}
}

// TestHotClaimSurvivesKill checks that a sandbox claimed from the hot pool
// is the user's once the create answered: SIGKILLs of the daemon (one with
// the claimed sandbox running, one with the next daemon's pool refilled,
// one with it asleep) must find it each time, its files, processes and
// hostname intact, and never take it for a pool sandbox nobody claimed.
func TestHotClaimSurvivesKill(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t, "--hot-pool", "1")
	c := d.Client
	waitHot(t, c)
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "claimed"})
	if !hotClaimed(d.Log(), sb.ID) {
		t.Fatalf("the create did not claim the hot sandbox (no hot=true create timings for %s):\n%s", sb.ID, d.Log())
	}
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo before > /root/f; nohup sleep 1000 > /dev/null 2>&1 & echo $! > /root/pid"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	check := func(when string) {
		t.Helper()
		got, err := c.GetSandbox(t.Context(), "claimed")
		if err != nil || got.ID != sb.ID {
			t.Fatalf("%s: %+v %v, want sandbox %s\n%s", when, got, err, sb.ID, d.Log())
		}
		testenv.AwaitExec(t, c, sb.ID)
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; hostname; kill -0 $(cat /root/pid) && echo alive"}})
		if r.err != nil || r.stdout != "before\nclaimed\nalive\n" {
			t.Fatalf("%s: exec: %+v, want the file, the claim's hostname and the process started before\n%s", when, r, d.Log())
		}
	}
	d.Kill()
	d.Start(nil)
	check("after a SIGKILL")
	// The new daemon's pool sandbox and the claimed one side by side.
	waitHot(t, c)
	d.Kill()
	d.Start(nil)
	check("after a SIGKILL with the pool refilled")
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	d.Start(nil)
	check("after a SIGKILL while it slept")
	if sbs, err := c.ListSandboxes(t.Context()); err != nil || len(sbs) != 1 {
		t.Fatalf("sandboxes: %+v %v, want only the claimed one (no pool sandbox is listed)", sbs, err)
	}
}

// hotClaimed reports whether the daemon's log says sandbox id was created
// from the hot pool.
func hotClaimed(log, id string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "create timings") && strings.Contains(line, id) && strings.Contains(line, "hot=true") {
			return true
		}
	}
	return false
}

// waitHot waits (bounded) until the daemon's hot pool holds a sandbox.
func waitHot(t *testing.T, c *sdk.Client) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Hot > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hot pool stays empty: %+v %v", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pool's background refill
	}
}
