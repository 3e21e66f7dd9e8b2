package codeint_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// leftovers lists the processes of sandbox id that are neither its agent,
// the interpreter's server nor one of its kernels (nor this listing), and
// counts the Python kernels.
func leftovers(t *testing.T, c *sdk.Client, id string) (rest []string, pyKernels int) {
	t.Helper()
	out, code := execOut(t, c, id, "ps -e -o pid=,args=")
	if code != 0 {
		t.Fatalf("ps: exit %d %q", code, out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		pid, args := f[0], strings.Join(f[1:], " ")
		switch {
		case strings.Contains(args, "ipykernel_launcher"):
			pyKernels++
		case pid == "1", strings.HasPrefix(args, "ps -e"), strings.HasPrefix(args, "/bin/sh -c ps -e"),
			strings.Contains(args, "/run/clade-codeint/server.py"),
			args == "/bin/bash --noprofile --norc", strings.HasPrefix(args, "node -e"):
		default:
			rest = append(rest, l)
		}
	}
	return rest, pyKernels
}

func checkNothingLeft(t *testing.T, c *sdk.Client, id string, wantKernels int) {
	t.Helper()
	rest, n := leftovers(t, c, id)
	if len(rest) > 0 || n != wantKernels {
		t.Fatalf("processes left in the sandbox: %q; %d Python kernels, want %d", rest, n, wantKernels)
	}
}

// TestInterpreterRunsEnd: a run ends at its timeout even when its kernel
// ignores the interrupt (the context is restarted, and says so) or its
// output never pauses, and when its client goes away; what the killed
// kernel started is gone too.
func TestInterpreterRunsEnd(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	run(t, c, id, sdk.RunCodeRequest{Code: "x = 5"})

	// A kernel that ignores SIGINT, with a child in a session of its own.
	t0 := time.Now()
	ex := run(t, c, id, sdk.RunCodeRequest{Code: "import signal, subprocess\nsubprocess.Popen(['sleep', '1000'], start_new_session=True)\n" +
		"signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", TimeoutMS: 1000})
	took := time.Since(t0)
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "restarted") || !strings.Contains(ex.Error.Value, "state") {
		t.Fatalf("a run ignoring SIGINT: %+v after %s", ex.Error, took)
	}
	t.Logf("a run ignoring SIGINT ended after %s: %s", took, ex.Error.Value)
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "'x' in dir(), 1+1"}); ex.Text() != "(False, 2)" {
		t.Fatalf("after the restart: %q %+v", ex.Text(), ex.Error)
	}
	checkNothingLeft(t, c, id, 1)

	// The same in bash: the shell itself ignores SIGINT.
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "B=1; trap '' INT; while :; do :; done", Language: "bash", TimeoutMS: 1000})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "restarted") {
		t.Fatalf("bash ignoring SIGINT: %+v", ex.Error)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "echo ok${B}", Language: "bash"}); strings.Join(ex.Stdout, "") != "ok\n" {
		t.Fatalf("bash after the restart: %+v", ex)
	}

	// Output that never pauses: the timeout still interrupts (the context
	// keeps its state), and what is sent is bounded.
	run(t, c, id, sdk.RunCodeRequest{Code: "y = 1"})
	t0 = time.Now()
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "while True: print('x' * 10000)", TimeoutMS: 2000})
	n := 0
	for _, s := range ex.Stdout {
		n += len(s)
	}
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || strings.Contains(ex.Error.Value, "restarted") || n > 8<<20 {
		t.Fatalf("endless output: %+v, %d bytes of stdout, after %s", ex.Error, n, time.Since(t0))
	}
	t.Logf("endless output ended after %s with %d bytes of stdout", time.Since(t0), n)
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "yes", Language: "bash", TimeoutMS: 2000})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" {
		t.Fatalf("endless bash output: %+v", ex.Error)
	}

	// A client that goes away from endless output interrupts the kernel:
	// the next run is answered, with the context's state.
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := c.RunCode(cctx, id, sdk.RunCodeRequest{Code: "while True: print('x' * 10000)"}, nil)
	cancel()
	if err == nil {
		t.Fatal("an endless run returned")
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "y"}); ex.Text() != "1" {
		t.Fatalf("after the client went away: %q %+v", ex.Text(), ex.Error)
	}
	// An endless run without output, at its timeout: interrupted, state kept.
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "while True: pass", TimeoutMS: 1000})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "keeps its state") {
		t.Fatalf("endless run: %+v", ex.Error)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "y + 1"}); ex.Text() != "2" {
		t.Fatalf("after an endless run: %q %+v", ex.Text(), ex.Error)
	}
	checkNothingLeft(t, c, id, 1)
}
