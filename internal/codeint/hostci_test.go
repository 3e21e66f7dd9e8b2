package codeint_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// TestInterpreterQueuedAndClosed: a run queued behind another in its
// context ends at its timeout without running, and one whose client gave
// up never runs; a bash kernel that closes its stdout is a dead kernel
// (not an internal error, nor a context whose next runs hang); concurrent
// context creates do not pass the limit.
func TestInterpreterQueuedAndClosed(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	run(t, c, id, sdk.RunCodeRequest{Code: "1"})

	// bash closing its stdout (then its stderr).
	for _, code := range []string{"exec >&-; echo gone", "exec 2>&-; echo gone"} {
		ex := run(t, c, id, sdk.RunCodeRequest{Code: code, Language: "bash", TimeoutMS: 30_000})
		if ex.Error == nil || ex.Error.Name != "KernelDied" || !strings.Contains(ex.Error.Value, "closed its") {
			t.Fatalf("bash %q: %+v", code, ex.Error)
		}
		ex = run(t, c, id, sdk.RunCodeRequest{Code: "echo after", Language: "bash", TimeoutMS: 30_000})
		if ex.Error == nil || ex.Error.Name != "KernelDied" {
			t.Fatalf("bash after %q: want the context dead, got %+v", code, ex)
		}
		if err := c.RestartCodeContext(context.Background(), id, "bash"); err != nil {
			t.Fatal(err)
		}
		ex = run(t, c, id, sdk.RunCodeRequest{Code: "echo after", Language: "bash", TimeoutMS: 30_000})
		if ex.Error != nil || strings.Join(ex.Stdout, "") != "after\n" {
			t.Fatalf("bash restarted after %q: %+v", code, ex)
		}
	}
	checkNothingLeft(t, c, id, 1)

	// A run queued behind a long one.
	long := make(chan *sdk.Execution, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Until the test releases it: long enough, and no longer.
		ex, _ := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "import os, time\nopen('/tmp/long','w').close()\n" +
			"while not os.path.exists('/tmp/release'): time.sleep(0.05)"}, nil)
		long <- ex
	}()
	if out, code := execOut(t, c, id, "while [ ! -e /tmp/long ]; do sleep 0.05; done"); code != 0 {
		t.Fatalf("%q %d", out, code)
	}
	t0 := time.Now()
	ex := run(t, c, id, sdk.RunCodeRequest{Code: "open('/tmp/queued','w').close()", TimeoutMS: 1000})
	if took := time.Since(t0); ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "did not run") || took > 10*time.Second {
		t.Fatalf("a queued run with a 1 s timeout: %+v after %s", ex.Error, took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "open('/tmp/ghost','w').close()"}, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a queued run given up: %v", err)
	}
	if out, code := execOut(t, c, id, "touch /tmp/release"); code != 0 {
		t.Fatalf("%q %d", out, code)
	}
	if ex := <-long; ex == nil || ex.Error != nil {
		t.Fatalf("the long run: %+v", ex)
	}
	// The next run in the context comes after any the queue still held.
	run(t, c, id, sdk.RunCodeRequest{Code: "1"})
	if out, _ := execOut(t, c, id, "ls /tmp/queued /tmp/ghost 2>&1"); strings.Count(out, "No such file") != 2 {
		t.Fatalf("code of a run that timed out in the queue or whose client gave up ran: %q", out)
	}

	// Concurrent creates stop at the limit (64 contexts, 2 of them the
	// defaults).
	var wg sync.WaitGroup
	for i := 0; i < 80; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.CreateCodeContext(context.Background(), id, sdk.CreateCodeContextRequest{Language: "bash"})
		}()
	}
	wg.Wait()
	l, err := c.CodeContexts(context.Background(), id)
	if err != nil || len(l) > 64 {
		t.Fatalf("%d contexts after 80 concurrent creates (%v), want at most 64", len(l), err)
	}
}
