package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
)

// onTerminal runs argv under util-linux script(1), on a pseudo-terminal
// that answers no query, and returns everything written to that terminal
// (stdout and stderr). script's stdin stays open until the command ends,
// so no end of input reaches the command.
func onTerminal(t *testing.T, env []string, argv ...string) string {
	t.Helper()
	if _, err := exec.LookPath("script"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("script not installed (apt-get install bsdutils; CI is set: requirements must be installed, see .ci/run)")
		}
		t.Skip("script not installed (apt-get install bsdutils)")
	}
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command("script", "-qec", strings.Join(quoted, " "), "/dev/null")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = r
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("script %v: %v: %q", argv, err, out)
	}
	return string(out)
}

// TestNoTerminalProbe: no verb but tui writes anything of its own to a
// terminal. A terminal query (the background colour, the cursor position)
// lands in a script's captured output where no terminal answers it, and
// where one does, its answer arrives on stdin, which exec -it forwards to
// the sandbox.
func TestNoTerminalProbe(t *testing.T) {
	bin, _ := testenv.Binaries(t)
	out := onTerminal(t, nil, bin, "version")
	if strings.Contains(out, "\x1b") {
		t.Errorf("clade version on a terminal wrote an escape sequence: %q", out)
	}
	if !strings.HasPrefix(out, "clade ") {
		t.Errorf("clade version on a terminal wrote %q, want its version", out)
	}
}

// TestExecTTYOutputExact: on a terminal, exec -t writes exactly what the
// sandbox's command wrote, nothing of clade's own before or after it.
func TestExecTTYOutputExact(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create")
	if code != 0 {
		t.Fatalf("create: %q %q", out, errs)
	}
	id := strings.TrimSpace(out)
	env := []string{"CLADE_HOST=" + d.Socket}

	// The sandbox's terminal turns tty's \n into \r\n; the local one is
	// raw during the session and adds nothing.
	got := onTerminal(t, env, d.Bin, "exec", "-it", id, "--", "tty")
	if !regexp.MustCompile(`^/dev/pts/\d+\r\n$`).MatchString(got) {
		t.Errorf("exec -it ID -- tty on a terminal wrote %q, want only the pts path line", got)
	}
	if got := onTerminal(t, env, d.Bin, "exec", "-t", id, "--", "printf", "x"); got != "x" {
		t.Errorf("exec -t ID -- printf x on a terminal wrote %q, want %q", got, "x")
	}
}
