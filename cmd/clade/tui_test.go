package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// tmux is a tmux server of the test's own with one 80x24 window.
type tmux struct {
	t      *testing.T
	socket string
}

func startTUI(t *testing.T, bin, host, interval string) *tmux {
	t.Helper()
	return startTmux(t, "env", "CLADE_HOST="+host, bin, "tui", "--interval", interval)
}

// startTmux runs argv in a new 80x24 tmux window of the test's own.
func startTmux(t *testing.T, argv ...string) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux not installed (apt-get install tmux)")
	}
	tm := &tmux{t: t, socket: fmt.Sprintf("clade-tui-test-%d-%d", os.Getpid(), time.Now().UnixNano())}
	tm.run(append([]string{"new-session", "-d", "-s", "tui", "-x", "80", "-y", "24"}, argv...)...)
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", tm.socket, "kill-server").Run()
		// kill-server returns before the server and its window's
		// processes are gone: wait for them (and kill what stays), so
		// that nothing outlives the test's temporary directories.
		for end := time.Now().Add(5 * time.Second); ; {
			if exec.Command("pgrep", "-f", tm.socket).Run() != nil {
				return
			}
			if time.Now().After(end) {
				_ = exec.Command("pkill", "-KILL", "-f", tm.socket).Run()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

func (tm *tmux) keys(keys ...string) {
	tm.t.Helper()
	tm.run(append([]string{"send-keys", "-t", "tui"}, keys...)...)
}

// waitFor polls the screen until it matches re, and returns it.
func (tm *tmux) waitFor(re string) string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(90 * time.Second)
	for {
		screen := tm.run("capture-pane", "-p", "-t", "tui")
		if rx.MatchString(screen) {
			return screen
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the screen never matched %q:\n%s", re, screen)
		}
		time.Sleep(100 * time.Millisecond) // polling the screen, not waiting for an event
	}
}

// TestTUI drives `clade tui` in an 80x24 tmux window as a person would:
// the list shows a created sandbox, s sleeps it and the screen says so,
// w wakes it, what others do shows at once, e opens a shell, d asks before
// it removes, and an unreachable daemon is said plainly. Stats refresh
// every hour: whatever changes on screen came from the events stream or
// the TUI's own actions, not from a poll.
func TestTUI(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	sb, err := d.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "tui-box", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	tm := startTUI(t, d.Bin, d.Socket, "1h")
	row := "> " + sb.ID + ` tui-box +`
	screen := tm.waitFor(row + `running +default +\d+s +[0-9.]+ +\d+M/256M +\d+`)
	for i, l := range strings.Split(screen, "\n") {
		if n := len([]rune(l)); n > 80 {
			t.Errorf("line %d is %d columns wide, more than the terminal's 80: %q", i, n, l)
		}
	}

	tm.keys("s")
	tm.waitFor(row + `sleeping +default`)
	tm.waitFor(`slept ` + sb.ID[:8])
	if got, err := d.Client.GetSandbox(t.Context(), sb.ID); err != nil || got.State != "sleeping" {
		t.Fatalf("after s the sandbox is %q (%v), want sleeping", got.State, err)
	}
	tm.keys("w")
	tm.waitFor(row + `running +default`)
	tm.waitFor(`woke ` + sb.ID[:8])
	tm.waitFor(`· live`)

	// Made from outside: the screen follows the events.
	if _, err := d.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	tm.waitFor(row + `sleeping +default`)
	two, err := d.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "tui-two", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	tm.waitFor(`(?m)^  ` + two.ID + ` tui-two +running`)
	if err := d.Client.DeleteSandbox(t.Context(), two.ID); err != nil {
		t.Fatal(err)
	}
	tm.waitFor(`clade · 1 sandbox · `)

	// e: a shell in the (sleeping) sandbox, which it wakes; its output on
	// the screen; exit gives the list back.
	tm.keys("e")
	tm.waitFor(`(?m)[#$]\s*$`)
	tm.keys("echo hi-$((6*7)) $(tty)", "Enter")
	tm.waitFor(`(?m)^hi-42 /dev/pts/\d+`)
	tm.keys("exit", "Enter")
	tm.waitFor(`shell in ` + sb.ID[:8] + ` ended`)
	tm.waitFor(row + `running +default`)

	// A lost stream is said, and followed again once the daemon is back.
	d.Stop()
	func() {
		defer d.Start(nil) // also when the wait fails: the sandbox needs its daemon to be cleaned up
		tm.waitFor(`events stream lost, reconnecting`)
		// The shell key with the daemon away says why there is no shell.
		tm.keys("e")
		tm.waitFor(`shell in ` + sb.ID[:8] + `: cannot reach the clade daemon`)
	}()
	tm.waitFor(`events stream back`)
	if _, err := d.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	tm.waitFor(row + `sleeping +default`)

	tm.keys("d")
	tm.waitFor(`remove sandbox ` + sb.ID[:8] + `.*\? y/n`)
	tm.keys("n")
	tm.waitFor(`cancelled`)
	if _, err := d.Client.GetSandbox(t.Context(), sb.ID); err != nil {
		t.Fatalf("n at the confirmation removed the sandbox: %v", err)
	}
	tm.keys("d")
	tm.waitFor(`\? y/n`)
	tm.keys("y")
	tm.waitFor(`removed ` + sb.ID[:8])
	tm.waitFor(`no sandboxes`)
	if _, err := d.Client.GetSandbox(t.Context(), sb.ID); !sdk.IsNotFound(err) {
		t.Fatalf("after d y the sandbox is still there: %v", err)
	}
	tm.keys("q")

	gone := startTUI(t, d.Bin, testenv.TempDir(t)+"/no-daemon.sock", "200ms")
	gone.waitFor(`DAEMON UNREACHABLE: cannot reach the clade daemon`)
}
