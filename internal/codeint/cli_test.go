package codeint_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunCodeCLI drives `clade run-code`: state kept across runs, a
// figure saved with --save-images, code from stdin, an exception's exit
// code and traceback, and refused usage.
func TestRunCodeCLI(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	clade := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(d.Bin, append([]string{"--host", d.Socket}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}
	cli := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return clade(stdin, append([]string{"run-code"}, args...)...)
	}
	if out, errs, code := cli("", id, "-c", "y = 20\nprint('hi')\ny * 2"); code != 0 || out != "hi\n40\n" {
		t.Fatalf("run-code: %d %q %q", code, out, errs)
	}
	if out, errs, code := cli("y + 1\n", id, "-"); code != 0 || out != "21\n" {
		t.Fatalf("run-code - (stdin): %d %q %q", code, out, errs)
	}
	dir := filepath.Join(t.TempDir(), "figs")
	out, errs, code := cli("", id, "--save-images", dir, "-c", "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
	if code != 0 {
		t.Fatalf("a figure: %d %q %q", code, out, errs)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "1.png")); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("the saved figure: %v (stderr %q)", err, errs)
	}
	if out, errs, code := cli("", id, "--lang", "bash", "-c", "echo $((6*7))"); code != 0 || out != "42\n" {
		t.Fatalf("bash: %d %q %q", code, out, errs)
	}
	if _, errs, code := cli("", id, "-c", "1/0"); code != 1 || !strings.Contains(errs, "ZeroDivisionError") {
		t.Fatalf("an exception: exit %d, stderr %q; want 1 and the traceback", code, errs)
	}
	for _, args := range [][]string{{id}, {id, "-c", "1", "file.py"}, {id, "--lang", "python", "--context", "c", "-c", "1"}, {id, "--env", "NOEQ", "-c", "1"}} {
		if _, errs, code := cli("", args...); code != 2 || errs == "" {
			t.Errorf("run-code %v: exit %d, stderr %q; want a usage error (2)", args, code, errs)
		}
	}
	if _, errs, code := cli("", "no-such-sandbox", "-c", "1"); code == 0 || !strings.Contains(errs, "no-such-sandbox") {
		t.Errorf("an unknown sandbox: exit %d, stderr %q", code, errs)
	}

	// code-context: a context created, listed, used, its dead kernel
	// restarted, removed.
	if out, errs, code := clade("", "code-context", "--help"); code != 0 || !strings.Contains(out, "restart") || !strings.Contains(out, "new kernel") {
		t.Fatalf("code-context --help: %d %q %q", code, out, errs)
	}
	out, errs, code = clade("", "code-context", "create", id, "--lang", "python")
	ctxID := strings.TrimSpace(out)
	if code != 0 || ctxID == "" {
		t.Fatalf("code-context create: %d %q %q", code, out, errs)
	}
	if out, errs, code := clade("", "code-context", "ls", id); code != 0 || !strings.Contains(out, ctxID) || !strings.Contains(out, "python") {
		t.Fatalf("code-context ls: %d %q %q", code, out, errs)
	}
	if out, errs, code := cli("", id, "--context", ctxID, "-c", "z = 3\nz"); code != 0 || out != "3\n" {
		t.Fatalf("run-code --context: %d %q %q", code, out, errs)
	}
	if _, errs, code := cli("", id, "--context", ctxID, "-c", "import os; os._exit(1)"); code != 1 || !strings.Contains(errs, "code-context restart") {
		t.Fatalf("a kernel that dies: exit %d, stderr %q; want 1 and how to recover", code, errs)
	}
	if _, errs, code := cli("", id, "--context", ctxID, "-c", "1"); code != 1 || !strings.Contains(errs, "is dead") {
		t.Fatalf("a run in a dead context: exit %d, stderr %q", code, errs)
	}
	if out, errs, code := clade("", "code-context", "restart", id, ctxID); code != 0 {
		t.Fatalf("code-context restart: %d %q %q", code, out, errs)
	}
	if out, errs, code := cli("", id, "--context", ctxID, "-c", "'z' in dir(), 2 * 21"); code != 0 || out != "(False, 42)\n" {
		t.Fatalf("after code-context restart: %d %q %q", code, out, errs)
	}
	if out, errs, code := clade("", "code-context", "rm", id, ctxID); code != 0 {
		t.Fatalf("code-context rm: %d %q %q", code, out, errs)
	}
	if out, _, code := clade("", "code-context", "ls", id, "--json"); code != 0 || strings.Contains(out, ctxID) || !strings.Contains(out, `"python"`) {
		t.Fatalf("code-context ls --json after rm: %d %q", code, out)
	}
	for _, args := range [][]string{{"code-context"}, {"code-context", "ls"}, {"code-context", "restart", id}, {"code-context", "rm", id}, {"code-context", "frob", id}} {
		if _, errs, code := clade("", args...); code != 2 || errs == "" {
			t.Errorf("clade %v: exit %d, stderr %q; want a usage error (2)", args, code, errs)
		}
	}
	if _, errs, code := clade("", "code-context", "restart", id, "no-such-context"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("restart of an unknown context: exit %d, stderr %q", code, errs)
	}
}
