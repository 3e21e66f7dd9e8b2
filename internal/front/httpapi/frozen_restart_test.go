package httpapi_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// freezeAgent stops sandbox id's agent from inside (`kill -STOP 1`, which
// any root process in a sandbox may do: gVisor does not spare init) and
// checks that it stopped: an exec that outlasts the stop never finishes.
// thawAfter, if not empty, is how long (a `sleep` argument) until the
// same background process sends SIGCONT.
func freezeAgent(t *testing.T, c *sdk.Client, id, thawAfter string) {
	t.Helper()
	script := "(sleep 0.3; kill -STOP 1) >/dev/null 2>&1 &"
	if thawAfter != "" {
		script = "(sleep 0.3; kill -STOP 1; sleep " + thawAfter + "; kill -CONT 1) >/dev/null 2>&1 &"
	}
	if r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}}); r.err != nil {
		t.Fatalf("exec: %+v", r)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1; echo done"}}); err == nil {
		t.Fatal("the agent still answers after kill -STOP 1")
	}
}

// TestRestartWithAFrozenAgent: a sandbox whose agent is stopped (`kill
// -STOP 1` inside) cannot answer a restarted daemon's attach. It must not
// hold the daemon's start until its attach gives up (30 s: the API served
// only after it), nor hold its lock through the background retries' long
// waits (requests to it waited up to 30 s for their "retry"), nor make
// `rm -f` of it slow; and it is reattached once its agent runs again.
func TestRestartWithAFrozenAgent(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	healthy := newSandbox(t, c, sdk.CreateSandboxRequest{})
	thawed := newSandbox(t, c, sdk.CreateSandboxRequest{})
	frozen := newSandbox(t, c, sdk.CreateSandboxRequest{})
	freezeAgent(t, c, thawed.ID, "25")
	freezeAgent(t, c, frozen.ID, "")
	d.Kill()
	t0 := time.Now()
	d.Start(nil)
	took := time.Since(t0)
	t.Logf("restart to the API serving, with two frozen agents: %s", took.Round(time.Millisecond))
	if took > 12*time.Second {
		t.Errorf("the restart served its API after %s, want the frozen sandboxes left to the background", took)
	}
	if r := run(t, c, healthy.ID, sdk.ExecRequest{Cmd: []string{"echo", "ok"}}); r.err != nil || r.stdout != "ok\n" {
		t.Fatalf("exec in the healthy sandbox after the restart: %+v", r)
	}
	// Requests to a frozen one say "retry" at once, also while the
	// background retries wait for its agent.
	var slowest time.Duration
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		t1 := time.Now()
		_, err := c.Exec(ctx, frozen.ID, sdk.ExecRequest{Cmd: []string{"true"}})
		cancel()
		took := time.Since(t1)
		slowest = max(slowest, took)
		if !sdk.IsUnavailable(err) || took > 3*time.Second {
			t.Fatalf("exec in the unattached sandbox: %v after %s, want a prompt Unavailable (retry)", err, took.Round(time.Millisecond))
		}
	}
	t.Logf("slowest answer to an unattached sandbox: %s", slowest.Round(time.Millisecond))
	t2 := time.Now()
	if err := c.DeleteSandbox(t.Context(), frozen.ID); err != nil {
		t.Fatalf("rm -f of the frozen sandbox: %v", err)
	}
	took = time.Since(t2)
	t.Logf("rm -f of a sandbox whose agent is stopped: %s", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("rm -f of a sandbox whose agent is stopped took %s, want seconds", took.Round(time.Millisecond))
	}
	// The one thawed later is reattached in the background.
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := run(t, c, thawed.ID, sdk.ExecRequest{Cmd: []string{"echo", "back"}})
		if r.err == nil && r.stdout == "back\n" {
			break
		}
		if !sdk.IsUnavailable(r.err) || time.Now().After(deadline) {
			t.Fatalf("exec once its agent runs again: %+v, want it reattached", r)
		}
		time.Sleep(200 * time.Millisecond) // polling until the retry lands
	}
}

// TestRestartResumesAPausedSandbox: a sandbox paused in the engine (runsc
// pause: its tasks and clock stopped) by a daemon killed before it
// resumed it never ran again: the restart took it for gone, and stopped
// it. The restart must resume it: exec works and its clock moves.
func TestRestartResumesAPausedSandbox(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo before > /root/f"}}); r.err != nil {
		t.Fatalf("exec: %+v", r)
	}
	root := filepath.Join(d.DataDir, "gvisor", "runsc")
	runsc := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(testenv.Runsc(t), append([]string{"--root", root}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("runsc %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	ids := strings.Fields(runsc("list", "-quiet"))
	if len(ids) != 1 {
		t.Fatalf("runsc lists %q, want the one sandbox", ids)
	}
	runsc("pause", ids[0])
	d.Kill()
	d.Start(nil)
	r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; date +%s%N; sleep 0.2; date +%s%N"}})
	var before string
	var a, b int64
	if r.err != nil {
		t.Fatalf("exec after the restart: %v, want the paused sandbox resumed", r.err)
	}
	if _, err := fmt.Sscan(r.stdout, &before, &a, &b); err != nil || before != "before" || b-a < int64(150*time.Millisecond) {
		t.Fatalf("exec after the restart: %q (%v), want the file written before and a clock that moves", r.stdout, err)
	}
}
