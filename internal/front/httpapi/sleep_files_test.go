package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// countSleepers counts the sandbox's processes whose command line starts
// with `sleep 900`.
const countSleepers = `n=0; for d in /proc/[0-9]*; do c=$(tr '\0' ' ' < $d/cmdline 2>/dev/null); case "$c" in "sleep 900"*) n=$((n+1));; esac; done; echo $n`

func sleepers(t *testing.T, c *sdk.Client, id string) string {
	t.Helper()
	r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", countSleepers}})
	if r.err != nil || r.st.Code != 0 {
		t.Fatalf("count processes: %+v %v %s", r.st, r.err, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// startSleeper starts a process that outlives its exec and writes a file.
func startSleeper(t *testing.T, c *sdk.Client, id, file string) {
	t.Helper()
	r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > " + file + " && setsid sleep 900 </dev/null >/dev/null 2>&1 &"}})
	if r.err != nil || r.st.Code != 0 || sleepers(t, c, id) != "1" {
		t.Fatalf("start a process: %+v %v %s (sleepers %s)", r.st, r.err, r.stderr, sleepers(t, c, id))
	}
}

func catFile(t *testing.T, c *sdk.Client, id, file string) string {
	t.Helper()
	r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"cat", file}})
	if r.err != nil || r.st.Code != 0 {
		t.Fatalf("cat %s: %+v %v %s", file, r.st, r.err, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// TestSleepWithoutMemory: POST /sleep {"memory": false} (clade sleep
// --no-memory) keeps a sandbox's files but not its processes, where a
// plain sleep keeps both; a bad body is a 400. A daemon killed in the
// wake after the restore and before the processes are dropped finishes
// the job in its reconcile: the sandbox runs with its files and none of
// its old processes.
func TestSleepWithoutMemory(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})

	// A plain sleep keeps the processes.
	startSleeper(t, c, sb.ID, "/root/a")
	if _, err := c.Sleep(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := sleepers(t, c, sb.ID); n != "1" {
		t.Fatalf("after a plain sleep and wake %s processes, want the 1 that ran", n)
	}

	// Without memory: the files stay, the processes go.
	slept, err := c.SleepFiles(ctx, sb.ID)
	if err != nil || slept.State != "sleeping" {
		t.Fatalf("sleep without memory: %+v %v", slept, err)
	}
	if _, err := c.Wake(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := sleepers(t, c, sb.ID); n != "0" {
		t.Fatalf("after a sleep without memory %s processes survived, want none", n)
	}
	if got := catFile(t, c, sb.ID, "/root/a"); got != "kept" {
		t.Fatalf("the file after a sleep without memory: %q", got)
	}
	// The next plain sleep keeps its processes again.
	startSleeper(t, c, sb.ID, "/root/b")
	if _, err := c.Sleep(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := sleepers(t, c, sb.ID); n != "1" {
		t.Fatalf("a plain sleep after one without memory: %s processes, want 1", n)
	}

	hc := rawClient(d)
	for _, body := range []string{`{"memory": "no"}`, `{"memroy": false}`, `[false]`} {
		resp, err := hc.Post("http://clade/v1/sandboxes/"+sb.ID+"/sleep", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("sleep with body %s: %d %s, want 400", body, resp.StatusCode, msg)
		}
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Fatalf("a refused sleep changed the sandbox: %+v %v", got, err)
	}

	// Killed between the restore and dropping the processes.
	if _, err := c.SleepFiles(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	d.Start([]string{"CLADE_CRASH_AT=wake-before-fresh"})
	if _, err := c.Wake(ctx, sb.ID); err == nil {
		t.Fatal("the wake succeeded; the daemon should have crashed in it")
	}
	_ = d.Wait()
	d.Start(nil)
	got, err := c.Wake(ctx, sb.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("after the restart: %+v %v\n%s", got, err, d.Log())
	}
	if n := sleepers(t, c, sb.ID); n != "0" {
		t.Fatalf("after a wake cut short and reconciled %s processes survived, want none", n)
	}
	if a, b := catFile(t, c, sb.ID, "/root/a"), catFile(t, c, sb.ID, "/root/b"); a != "kept" || b != "kept" {
		t.Fatalf("the files after the reconcile: %q %q", a, b)
	}

	// Removed while asleep without memory: nothing is left (image,
	// upper layer, network slot, mounts, processes).
	if _, err := c.SleepFiles(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	d.Stop() // the daemon's own network pool is not a leak
	if leaks := append(testenv.Leaks(d.DataDir), d.Net.NetLeaks()...); len(leaks) > 0 {
		t.Fatalf("left after removing a sandbox asleep without memory:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// TestSleepWithoutMemoryNoShell: the wake of a sleep without memory
// empties a sandbox whose /bin/sh the user removed (it woke with an error
// on every try, the files out of reach) or replaced with one that exits at
// once (the processes survived).
func TestSleepWithoutMemoryNoShell(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	for _, tc := range []struct{ name, sh string }{
		{"removed", "rm -f /bin/sh /usr/bin/sh"},
		{"spawner", "setsid sh -c 'while :; do setsid sleep 900 </dev/null >/dev/null 2>&1 & sleep 0.05; done' </dev/null >/dev/null 2>&1 &"},
		{"replaced", "rm -f /bin/sh /usr/bin/sh && printf '#!/root/sh\\nexit 0\\n' > /usr/bin/sh && chmod +x /usr/bin/sh && ln -sf /usr/bin/sh /bin/sh 2>/dev/null; true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
			startSleeper(t, c, sb.ID, "/root/a")
			if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cp \"$(readlink -f /bin/sh)\" /root/sh && " + tc.sh}}); r.err != nil || r.st.Code != 0 {
				t.Fatalf("change /bin/sh: %+v %v %s", r.st, r.err, r.stderr)
			}
			if _, err := c.SleepFiles(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if got, err := c.Wake(ctx, sb.ID); err != nil || got.State != "running" {
				t.Fatalf("wake with /bin/sh %s: %+v %v", tc.name, got, err)
			}
			r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"/root/sh", "-c", countSleepers}})
			if r.err != nil || r.st.Code != 0 || strings.TrimSpace(r.stdout) != "0" {
				t.Fatalf("after a sleep without memory: %q processes (%+v %v %s), want none", r.stdout, r.st, r.err, r.stderr)
			}
			if got := catFile(t, c, sb.ID, "/root/a"); got != "kept" {
				t.Fatalf("the file: %q", got)
			}
		})
	}
}
