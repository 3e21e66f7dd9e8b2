package nothp_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/nothp"
)

// The test binary is its own launcher.
func TestMain(m *testing.M) {
	nothp.Main()
	os.Exit(m.Run())
}

func TestCommandTurnsTHPOff(t *testing.T) {
	// Without the launcher a command has THP as the host gives it.
	out, err := exec.Command("/bin/sh", "-c", "grep THP_enabled /proc/self/status").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "THP_enabled:\t1") {
		t.Skipf("this host has THP off for every process (%q): nothing to turn off", out)
	}
	out, err = nothp.Command(t.Context(), os.Args[0], []string{"/bin/sh", "-c", "grep THP_enabled /proc/self/status; echo $0"}).Output()
	if err != nil {
		t.Fatal(err)
	}
	// THP off, and the command's own argv[0].
	if got := strings.Fields(string(out)); len(got) != 3 || got[1] != "0" || got[2] != "/bin/sh" {
		t.Fatalf("the launched command says %q, want THP_enabled 0 and argv[0] /bin/sh", out)
	}
}

func TestCommandMissing(t *testing.T) {
	out, err := nothp.Command(t.Context(), os.Args[0], []string{"/nonexistent/qemu"}).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 127 || !strings.Contains(string(out), "exec /nonexistent/qemu") {
		t.Fatalf("launching a missing command: %v, %q; want exit 127 and the path in the message", err, out)
	}
}

// TestEnvironmentDoesNotLaunch: the launcher is also a sandbox's PID 1,
// started with its user's environment; no variable there makes it exec.
func TestEnvironmentDoesNotLaunch(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "_CLADE_NO_THP_EXEC=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the binary with the old marker in its environment: %v, %q; want it to run as itself", err, out)
	}
}
