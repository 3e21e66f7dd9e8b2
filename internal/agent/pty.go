package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Default terminal size when the host gives none.
const (
	defaultRows = 24
	defaultCols = 80
)

// openPTY opens a new pseudo-terminal: the master side, which the agent
// keeps (reads are the terminal's output, writes what is typed), and the
// slave side, which becomes the process's terminal.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n uint32
	// Through Control, not Fd: Fd would put the master in blocking mode,
	// and a Close could then no longer end a Read in progress.
	cerr := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		var err error
		n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		return err
	})
	if cerr != nil {
		master.Close()
		return nil, nil, cerr
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", err)
	}
	return master, slave, nil
}

// control runs f on f's descriptor without changing its mode.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// setSize sets a terminal's size; the kernel sends SIGWINCH to its
// foreground process group.
func setSize(master *os.File, rows, cols uint16) error {
	return control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
}

// getSize returns a terminal's size.
func getSize(master *os.File) (unix.Winsize, error) {
	var ws *unix.Winsize
	err := control(master, func(fd int) error {
		var err error
		ws, err = unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		return err
	})
	if err != nil {
		return unix.Winsize{}, err
	}
	return *ws, nil
}

// resize sets the channel's terminal size; a channel without a terminal
// (or whose process has ended) ignores it. The size is then held for a
// moment against readline's write-back (see holdSize).
func (ch *channel) resize(rows, cols uint16) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.pty == nil {
		return
	}
	old, err := getSize(ch.pty)
	if err != nil || setSize(ch.pty, rows, cols) != nil {
		return
	}
	if h := ch.hold; h != nil {
		// The goroutine holding the last one holds this one (a host that
		// resizes often costs one goroutine, not one a resize). Readline
		// may write back the size it read before any of the resizes held,
		// not only the one before this (a size sent twice, resizes in a
		// row): each stays an old size.
		h.addOld(old)
		h.rows, h.cols = rows, cols
		h.n++
		return
	}
	if old.Row != rows || old.Col != cols {
		ch.hold = &sizeHold{olds: []unix.Winsize{old}, rows: rows, cols: cols}
		go ch.holdSize()
	}
}

// sizeHold is a resize holdSize holds: back to rows x cols when the size
// returns to one of olds.
type sizeHold struct {
	// olds are the sizes the terminal had since the hold began (the last
	// maxOlds of them), the first the one before its first resize.
	olds       []unix.Winsize
	rows, cols uint16
	n          uint64 // resizes it took over; one restarts the looks
}

// maxOlds bounds a hold's old sizes (a host resizing in a tight loop).
const maxOlds = 8

// addOld adds ws to the hold's old sizes, once; the oldest past maxOlds
// are forgotten but the first.
func (h *sizeHold) addOld(ws unix.Winsize) {
	for _, o := range h.olds {
		if o.Row == ws.Row && o.Col == ws.Col {
			return
		}
	}
	if len(h.olds) == maxOlds {
		h.olds = append(h.olds[:1], h.olds[2:]...)
	}
	h.olds = append(h.olds, ws)
}

// undone reports whether the terminal's size cur is one of the hold's old
// sizes, not the one it holds: a write-back undid the resize.
func (h *sizeHold) undone(cur unix.Winsize) bool {
	if cur.Row == h.rows && cur.Col == h.cols {
		return false
	}
	for _, o := range h.olds {
		if o.Row == cur.Row && o.Col == cur.Col {
			return true
		}
	}
	return false
}

// sizeChecks are the waits between holdSize's looks at a terminal: about
// a second in all, most of the looks early.
var sizeChecks = []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond,
	8 * time.Millisecond, 16 * time.Millisecond, 32 * time.Millisecond, 64 * time.Millisecond,
	128 * time.Millisecond, 256 * time.Millisecond, 512 * time.Millisecond}

// holdSize puts the channel's last resize back when the terminal's size
// returns to one it had before (since the hold began), for about a second
// after it. Readline
// (bash's prompt) reads the size and writes the same value back each time
// it prepares the terminal (rltty.c set_winsize, TIOCGWINSZ then
// TIOCSWINSZ), to stop a background readline before it touches the
// terminal. A resize that lands between the two is undone, silently:
// `stty size` then prints the old size. On Linux the two calls are a few
// hundred nanoseconds apart; under gVisor, on a loaded host, they can be
// milliseconds apart, and a resize sent as a shell starts (E2B's
// pty.create, then pty.resize) was lost about once in two hundred times.
// Nothing tells the agent of a size change, so it looks. A size set to
// something else (`stty rows N` in the sandbox) is left alone.
func (ch *channel) holdSize() {
	var n uint64
	for i := 0; ; i++ {
		ch.mu.Lock()
		h := ch.hold
		if h.n != n {
			n, i = h.n, 0 // a later resize: look as if it were the first
		}
		if ch.pty == nil || i == len(sizeChecks) {
			ch.hold = nil
			ch.mu.Unlock()
			return
		}
		ch.mu.Unlock()
		time.Sleep(sizeChecks[i]) // no event says the size changed: look again
		ch.mu.Lock()
		if ch.pty != nil && h.n == n {
			if cur, err := getSize(ch.pty); err == nil && h.undone(cur) {
				_ = setSize(ch.pty, h.rows, h.cols)
			}
		}
		ch.mu.Unlock()
	}
}

// execTTY runs cmd on a new pseudo-terminal, as its controlling terminal
// in a new session (so job control and Ctrl-C work as in a login shell):
// the terminal's output goes to the channel's stdout, the channel's stdin
// is what is typed. Stderr stays empty.
func (ch *channel) execTTY(cmd *exec.Cmd) wire.ExitMsg {
	master, slave, err := openPTY()
	if err != nil {
		return wire.ExitMsg{Code: 126, Error: "no terminal for the command: " + err.Error(), ErrorClass: string(errdefs.Unavailable)}
	}
	rows, cols := ch.req.Rows, ch.req.Cols
	if rows == 0 || cols == 0 {
		rows, cols = defaultRows, defaultCols
	}
	if err := setSize(master, rows, cols); err != nil {
		master.Close()
		slave.Close()
		return errExit(fmt.Errorf("set terminal size: %w", err))
	}
	if envValue(cmd.Env, "TERM") == "" {
		cmd.Env = append(cmd.Env, "TERM=xterm")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session leader with the terminal as its controlling terminal (fd 0
	// in the child); it is also its own process group, so killing -pid
	// still kills the tree as for a plain exec.
	cmd.SysProcAttr.Setpgid = false
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Setctty = true
	cmd.SysProcAttr.Ctty = 0
	wait, err := ch.s.a.reaper.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	slave.Close() // the process holds it now
	if err != nil {
		master.Close()
		return startFailed(err)
	}
	ch.mu.Lock()
	ch.proc = cmd.Process
	ch.pty = master
	aborted := ch.aborted
	ch.mu.Unlock()
	pid := cmd.Process.Pid
	if aborted {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	started, _ := json.Marshal(wire.StartedMsg{PID: pid})
	_ = ch.s.conn.Write(wire.Started, ch.id, started)

	if ch.stdin != nil {
		go func() { _, _ = io.Copy(master, ch.stdin) }()
	}
	var pumps sync.WaitGroup
	pumps.Add(1)
	// The terminal's reads end with EIO once every holder of its slave
	// side has closed it.
	out := newOutPump(ch.stdout, master)
	go out.run(&pumps)
	var once sync.Once
	return ch.waitExit(wait, pid, &pumps, []*outPump{out}, func() {
		once.Do(func() {
			ch.mu.Lock()
			ch.pty = nil
			ch.mu.Unlock()
			master.Close()
		})
	})
}
