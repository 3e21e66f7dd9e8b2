package main_test

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/testenv"
)

// hostPTY is a pseudo-terminal on the host that a test drives as a person
// at a keyboard would: it types into the master and reads the screen.
type hostPTY struct {
	master, slave *os.File
	mu            sync.Mutex
	out           strings.Builder
	changed       chan struct{}
}

func openHostPTY(t *testing.T, rows, cols uint16) *hostPTY {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals on this host: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &hostPTY{master: m, slave: s, changed: make(chan struct{})}
	p.resize(t, rows, cols)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := m.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		m.Close()
		<-done
	})
	return p
}

func (p *hostPTY) resize(t *testing.T, rows, cols uint16) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(p.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
}

func (p *hostPTY) screen() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *hostPTY) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		p.mu.Lock()
		ok, changed := strings.Contains(p.out.String(), s), p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the terminal never showed %q; it shows %q", s, p.screen())
		}
	}
}

func (p *hostPTY) termios(t *testing.T) unix.Termios {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return *tio
}

// start runs clade on the terminal as its controlling terminal, as a shell
// would.
func (p *hostPTY) start(t *testing.T, d *testenv.Daemon, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(d.Bin, args...)
	cmd.Env = append(os.Environ(), "CLADE_HOST="+d.Socket, "TERM=xterm-test")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.slave, p.slave, p.slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// TestExecInteractiveTTY drives `clade exec -it` from a real terminal: the
// command sees a terminal of the user's size and TERM, follows a window
// resize, gets Ctrl-C as typed, its exit code is clade's, and the user's
// terminal is in raw mode during the session and restored after it, also
// when the session ends by Ctrl-C.
func TestExecInteractiveTTY(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create")
	if code != 0 {
		t.Fatalf("create: %q %q", out, errs)
	}
	id := strings.TrimSpace(out)
	// SIGWINCH is blocked and taken with sigwait, not a handler: a Python
	// handler runs only between bytecodes, so one that arrives just before
	// the blocking readline would wait for typed input (and one inside the
	// print's flush raises "reentrant call"); a blocked signal stays pending.
	const script = `import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH})
first = os.get_terminal_size(0)
print("size %d %d term %s" % (*os.get_terminal_size(0)[::-1], os.environ.get("TERM")), flush=True)
while True:
    signal.sigwait({signal.SIGWINCH})
    now = os.get_terminal_size(0)
    print("winch %d %d" % now[::-1], flush=True)
    if now != first:
        break
line = sys.stdin.readline()
print("got " + line.strip(), flush=True)
sys.exit(5)`

	t.Run("session", func(t *testing.T) {
		p := openHostPTY(t, 27, 91)
		before := p.termios(t)
		if before.Lflag&unix.ICANON == 0 || before.Lflag&unix.ECHO == 0 {
			t.Fatalf("a new terminal should be cooked: lflag %#x", before.Lflag)
		}
		cmd := p.start(t, d, "exec", "-it", id, "--", "python3", "-c", script)
		p.waitFor(t, "size 27 91 term xterm-test")
		if during := p.termios(t); during.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
			t.Errorf("during the session the local terminal is not raw: lflag %#x", during.Lflag)
		}
		p.resize(t, 33, 120) // the kernel sends clade SIGWINCH
		p.waitFor(t, "winch 33 120")
		if _, err := p.master.Write([]byte("typed\r")); err != nil {
			t.Fatal(err)
		}
		p.waitFor(t, "got typed")
		if code := exitCode(t, cmd); code != 5 {
			t.Errorf("clade exited %d, want the command's 5; screen %q", code, p.screen())
		}
		if after := p.termios(t); after != before {
			t.Errorf("terminal not restored: before %+v, after %+v", before, after)
		}
	})

	t.Run("ctrl-c", func(t *testing.T) {
		p := openHostPTY(t, 24, 80)
		before := p.termios(t)
		cmd := p.start(t, d, "exec", "-ti", id, "--", "sh", "-c", "echo ready; sleep 300; echo survived")
		p.waitFor(t, "ready")
		if _, err := p.master.Write([]byte{0x03}); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd); code != 130 {
			t.Errorf("clade exited %d after ^C, want 130; screen %q", code, p.screen())
		}
		if strings.Contains(p.screen(), "survived") {
			t.Errorf("the command survived ^C: %q", p.screen())
		}
		if after := p.termios(t); after != before {
			t.Errorf("terminal not restored: before %+v, after %+v", before, after)
		}
	})

	t.Run("signal", func(t *testing.T) {
		p := openHostPTY(t, 24, 80)
		before := p.termios(t)
		cmd := p.start(t, d, "exec", "-it", id, "--", "sh", "-c", "echo ready; exec sleep 300")
		p.waitFor(t, "ready")
		// A SIGTERM to clade goes to the command; the session ends with it.
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd); code != 143 {
			t.Errorf("clade exited %d after SIGTERM, want 143; screen %q", code, p.screen())
		}
		if after := p.termios(t); after != before {
			t.Errorf("terminal not restored: before %+v, after %+v", before, after)
		}
	})

	// Piped into, a terminal session ends where the input does (the
	// command sees the terminal's EOF), with or without a last newline.
	t.Run("piped stdin ends", func(t *testing.T) {
		for _, in := range []string{"one\ntwo\n", "one\ntwo"} {
			out, errs, code := cli(t, d, in, "exec", "-it", "--timeout", "30s", id, "--", "sh", "-c", "cat >/tmp/got; echo done")
			if code != 0 || !strings.Contains(out, "done") {
				t.Fatalf("exec -it with %q piped in: exit %d, stdout %q, stderr %q", in, code, out, errs)
			}
			got, _, _ := cli(t, d, "", "exec", id, "--", "cat", "/tmp/got")
			if got != in {
				t.Errorf("the command read %q, want %q", got, in)
			}
		}
	})

	t.Run("error restores", func(t *testing.T) {
		p := openHostPTY(t, 24, 80)
		before := p.termios(t)
		cmd := p.start(t, d, "exec", "-it", "no-such-sandbox", "--", "sh")
		if code := exitCode(t, cmd); code != 1 {
			t.Errorf("clade exited %d for a missing sandbox, want 1", code)
		}
		p.waitFor(t, "no such sandbox")
		if after := p.termios(t); after != before {
			t.Errorf("terminal not restored: before %+v, after %+v", before, after)
		}
	})
}
