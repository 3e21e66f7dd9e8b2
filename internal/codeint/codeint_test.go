package codeint_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// start starts a daemon (with extraArgs) and a code interpreter sandbox
// of the test's own. The tests that call it run in parallel (t.Parallel:
// two at a time, go test's -parallel on two cores): one's waits (the
// wedged server's answer wait; run timeouts) overlap another's work. The
// hot-pool tests stay sequential: they start Python kernels, all CPU, and
// beside another test's a first run passed run's 2 minutes under load.
func start(t *testing.T, extraArgs ...string) (*testenv.Daemon, string) {
	t.Helper()
	testenv.BuiltinImage(t, codeint.Image)
	d := testenv.StartDaemon(t, extraArgs...)
	sb, err := d.Client.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	return d, sb.ID
}

// ansi matches terminal colour sequences: IPython colours tracebacks (as
// Jupyter's, which E2B's clients get too).
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

func run(t *testing.T, c *sdk.Client, id string, req sdk.RunCodeRequest) *sdk.Execution {
	t.Helper()
	// A run that never answers fails the test (and its cleanup removes the
	// daemon) instead of hanging the package until go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ex, err := c.RunCode(ctx, id, req, nil)
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	return ex
}

func TestInterpreter(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	ctx := context.Background()

	// State kept, stdout streamed in order and before the run ends. The
	// kernel may send one print's text and its newline as two messages
	// (its stream flushes on a timer too), so adjacent stdout events are
	// joined before the order is read.
	var order []string
	ex, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "import time\nx = 41\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)\nx + 1"},
		func(e sdk.CodeEvent) {
			if n := len(order); n > 0 && e.Type == "stdout" && strings.HasPrefix(order[n-1], "stdout:") {
				order[n-1] += e.Text
				return
			}
			text := e.Text
			if e.Type != "stdout" {
				text = strings.TrimSpace(text)
			}
			order = append(order, e.Type+":"+text)
		})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text() != "42" || strings.Join(ex.Stdout, "") != "0\n1\n2\n" {
		t.Fatalf("got text %q stdout %q", ex.Text(), ex.Stdout)
	}
	if len(order) < 2 || order[0] != "stdout:0\n1\n2\n" || order[1] != "result:42" {
		t.Fatalf("event order %q", order)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "x"}); ex.Text() != "41" {
		t.Fatalf("state lost: %q", ex.Text())
	}
	// A DataFrame as HTML and text; a matplotlib figure as PNG.
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"})
	if len(ex.Results) != 1 || !strings.Contains(ex.Results[0].HTML, "<table") || !strings.Contains(ex.Text(), "a  b") {
		t.Fatalf("DataFrame: %+v", ex.Results)
	}
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"})
	png := ""
	for _, r := range ex.Results {
		png += r.PNG
	}
	if b, err := base64.StdEncoding.DecodeString(png); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Fatalf("no PNG: %v %+v", err, ex.Results)
	}
	// An exception's traceback.
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "def f():\n    return 1/0\nf()"})
	if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || !strings.Contains(ansi.ReplaceAllString(ex.Error.Traceback, ""), "f()") {
		t.Fatalf("error: %+v", ex.Error)
	}
	// A timeout interrupts; the context lives on.
	t0 := time.Now()
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "import time\nwhile True: time.sleep(0.1)", TimeoutMS: 500})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || time.Since(t0) > 10*time.Second {
		t.Fatalf("timeout: %+v after %s", ex.Error, time.Since(t0))
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "x * 2"}); ex.Text() != "82" {
		t.Fatalf("after timeout: %q %+v", ex.Text(), ex.Error)
	}
	// env per run, not kept.
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "import os; os.environ.get('FOO')", Env: map[string]string{"FOO": "bar"}}); ex.Text() != "'bar'" {
		t.Fatalf("env: %q", ex.Text())
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "os.environ.get('FOO')"}); ex.Text() != "" {
		t.Fatalf("env kept: %q", ex.Text())
	}
	// Two contexts are isolated; restart clears one.
	other, err := c.CreateCodeContext(ctx, id, sdk.CreateCodeContextRequest{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "'x' in dir()", Context: other.ID}); ex.Text() != "False" {
		t.Fatalf("contexts not isolated: %q", ex.Text())
	}
	run(t, c, id, sdk.RunCodeRequest{Code: "y = 7", Context: other.ID})
	if err := c.RestartCodeContext(ctx, id, other.ID); err != nil {
		t.Fatal(err)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "y", Context: other.ID}); ex.Error == nil || ex.Error.Name != "NameError" {
		t.Fatalf("restart kept state: %+v", ex)
	}
	list, err := c.CodeContexts(ctx, id)
	if err != nil || len(list) != 2 {
		t.Fatalf("contexts %+v %v", list, err)
	}
	if err := c.RemoveCodeContext(ctx, id, other.ID); err != nil {
		t.Fatal(err)
	}
	// bash and js keep state too.
	run(t, c, id, sdk.RunCodeRequest{Code: "A=5", Language: "bash"})
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "echo $((A+1))", Language: "bash"}); strings.Join(ex.Stdout, "") != "6\n" {
		t.Fatalf("bash: %+v", ex)
	}
	run(t, c, id, sdk.RunCodeRequest{Code: "let q = 20", Language: "js"})
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "q + 1", Language: "javascript"}); ex.Text() != "21" {
		t.Fatalf("js: %+v", ex)
	}
}

func TestInterpreterHostile(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	ctx := context.Background()
	for _, lang := range []string{"r", "java"} {
		_, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "1", Language: lang}, nil)
		if !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "python, bash and js") {
			t.Fatalf("%s: %v", lang, err)
		}
		if _, err := c.CreateCodeContext(ctx, id, sdk.CreateCodeContextRequest{Language: lang}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "python, bash and js") {
			t.Fatalf("a %s context: %v", lang, err)
		}
	}
	_, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "1", Context: "not-a-context"}, nil)
	if !sdk.IsNotFound(err) {
		t.Fatalf("bad context: %v", err)
	}
	// A context of another sandbox is not found here, and nothing of it
	// is said.
	other, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Image: codeint.Image, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := c.CreateCodeContext(ctx, other.ID, sdk.CreateCodeContextRequest{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, other.ID, sdk.RunCodeRequest{Code: "secret = 'of the other sandbox'", Context: foreign.ID})
	_, err = c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "secret", Context: foreign.ID}, nil)
	if !sdk.IsNotFound(err) || strings.Contains(err.Error(), other.ID) || strings.Contains(err.Error(), "of the other") {
		t.Fatalf("a context of another sandbox: %v", err)
	}
	if err := c.RestartCodeContext(ctx, id, foreign.ID); !sdk.IsNotFound(err) {
		t.Fatalf("restart of another sandbox's context: %v", err)
	}
	if err := c.RemoveCodeContext(ctx, id, foreign.ID); !sdk.IsNotFound(err) {
		t.Fatalf("removal of another sandbox's context: %v", err)
	}
	if ex := run(t, c, other.ID, sdk.RunCodeRequest{Code: "secret", Context: foreign.ID}); ex.Text() != "'of the other sandbox'" {
		t.Fatalf("the other sandbox's context: %q %+v", ex.Text(), ex.Error)
	}
	if list, err := c.CodeContexts(ctx, id); err != nil || len(list) != 1 || list[0].ID != "python" {
		t.Fatalf("contexts: %+v %v", list, err)
	}
	// Huge output is bounded.
	ex := run(t, c, id, sdk.RunCodeRequest{Code: "for _ in range(40): print('a' * (1 << 20))"})
	n := 0
	for _, s := range ex.Stdout {
		n += len(s)
	}
	if n > 9<<20 || !strings.Contains(strings.Join(ex.Stderr, ""), "truncated") {
		t.Fatalf("huge output: %d bytes, stderr %q", n, ex.Stderr)
	}
	// A kernel that dies: a clear error, then restartable.
	for _, die := range []string{"import os; os._exit(3)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"} {
		ex = run(t, c, id, sdk.RunCodeRequest{Code: die})
		if ex.Error == nil || ex.Error.Name != "KernelDied" || !strings.Contains(ex.Error.Value, "code-context restart") {
			t.Fatalf("%s: %+v", die, ex.Error)
		}
		// Running in the dead context says how to recover.
		ex = run(t, c, id, sdk.RunCodeRequest{Code: "1"})
		if ex.Error == nil || ex.Error.Name != "KernelDied" || !strings.Contains(ex.Error.Value, "is dead") || !strings.Contains(ex.Error.Value, "restart") {
			t.Fatalf("a run in a dead context: %+v", ex.Error)
		}
		if err := c.RestartCodeContext(ctx, id, "python"); err != nil {
			t.Fatal(err)
		}
		if ex := run(t, c, id, sdk.RunCodeRequest{Code: "1+1"}); ex.Text() != "2" {
			t.Fatalf("after restart: %+v", ex)
		}
	}
	// A run that never ends is cut by the client going away; the context
	// answers the next run.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = c.RunCode(cctx, id, sdk.RunCodeRequest{Code: "while True: pass"}, nil)
	cancel()
	if err == nil {
		t.Fatal("endless run returned")
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "2+2"}); ex.Text() != "4" {
		t.Fatalf("after abandoned run: %+v", ex)
	}
	// A run that never ends ends at its timeout.
	ex = run(t, c, id, sdk.RunCodeRequest{Code: "while True: pass", TimeoutMS: 1000})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" {
		t.Fatalf("endless run with a timeout: %+v", ex.Error)
	}
	// After all that, only the server and the default Python kernel run.
	checkNothingLeft(t, c, id, 1)
	// A sandbox without the interpreter says so.
	plain, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunCode(ctx, plain.ID, sdk.RunCodeRequest{Code: "1"}, nil); err == nil || !strings.Contains(err.Error(), codeint.Image) {
		t.Fatalf("plain sandbox: %v", err)
	}
}

func TestInterpreterForkAndSleep(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	run(t, c, id, sdk.RunCodeRequest{Code: "import pandas as pd\ndf = pd.DataFrame({'v': range(1000)})\nn = 10"})
	fr, err := c.Fork(ctx, id, 4)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(fr.Children))
	for i, ch := range fr.Children {
		if ch.ID == "" {
			t.Fatalf("child %d: %s", i, ch.Error)
		}
		wg.Add(1)
		go func(i int, cid string) {
			defer wg.Done()
			ex, err := c.RunCode(ctx, cid, sdk.RunCodeRequest{Code: fmt.Sprintf("n += %d\nlen(df) + n", i)}, nil)
			if err != nil {
				errs <- err
				return
			}
			if want := fmt.Sprint(1010 + i); ex.Text() != want {
				errs <- fmt.Errorf("child %d: %q, want %s (%+v)", i, ex.Text(), want, ex.Error)
			}
		}(i, ch.ID)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The parent kept its own n.
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "n"}); ex.Text() != "10" {
		t.Fatalf("parent: %q", ex.Text())
	}
	if _, err := c.Sleep(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ex := run(t, c, id, sdk.RunCodeRequest{Code: "len(df) + n"}); ex.Text() != "1010" {
		t.Fatalf("after sleep and wake: %q %+v", ex.Text(), ex.Error)
	}
}
