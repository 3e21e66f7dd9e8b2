package main

import (
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/clade-sandbox/clade/sdk"
)

// localTerm is the user's terminal during `exec -t`: in raw mode while
// keys go to the sandbox (so Ctrl-C is a byte for the remote terminal, not
// a signal here), with its size changes forwarded.
type localTerm struct {
	in      int
	saved   *term.State // nil when not in raw mode
	size    sdk.WindowSize
	resizes chan sdk.WindowSize
	winch   chan os.Signal
	done    chan struct{}
}

// openLocalTerm looks at the terminal the command runs in: stdin put in
// raw mode when raw is set and it is a terminal, the size from stdin or
// stdout. It never fails: without a terminal, the remote one gets the
// default size and nothing is changed here. Call restore on every path.
func openLocalTerm(raw bool) (*localTerm, error) {
	lt := &localTerm{in: int(os.Stdin.Fd()), done: make(chan struct{})}
	sizeFd := -1
	for _, fd := range []int{lt.in, int(os.Stdout.Fd())} {
		if term.IsTerminal(fd) {
			sizeFd = fd
			break
		}
	}
	if sizeFd < 0 {
		return lt, nil
	}
	if cols, rows, err := term.GetSize(sizeFd); err == nil && rows > 0 && cols > 0 {
		lt.size = sdk.WindowSize{Rows: uint16(rows), Cols: uint16(cols)}
	}
	lt.resizes = make(chan sdk.WindowSize, 1)
	lt.winch = make(chan os.Signal, 1)
	signal.Notify(lt.winch, syscall.SIGWINCH)
	go func() {
		for {
			select {
			case <-lt.done:
				return
			case <-lt.winch:
			}
			cols, rows, err := term.GetSize(sizeFd)
			if err != nil || rows <= 0 || cols <= 0 {
				continue
			}
			sz := sdk.WindowSize{Rows: uint16(rows), Cols: uint16(cols)}
			select { // only the latest size matters
			case <-lt.resizes:
			default:
			}
			lt.resizes <- sz
		}
	}()
	if raw && term.IsTerminal(lt.in) {
		st, err := term.MakeRaw(lt.in)
		if err != nil {
			lt.restore()
			return nil, err
		}
		lt.saved = st
	}
	return lt, nil
}

// restore puts the terminal back as it was and stops forwarding resizes.
// It is idempotent.
func (lt *localTerm) restore() {
	select {
	case <-lt.done:
		return
	default:
	}
	close(lt.done)
	if lt.winch != nil {
		signal.Stop(lt.winch)
	}
	if lt.saved != nil {
		_ = term.Restore(lt.in, lt.saved)
	}
}

// forwardSignals passes the first signal on to the command; a second one
// gives up on it (cancel): a command that ignores signals, or a daemon
// that no longer answers, must not hold the user's terminal in raw mode.
func forwardSignals(in <-chan os.Signal, done <-chan struct{}, cancel func()) <-chan os.Signal {
	out := make(chan os.Signal, 1)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				return
			case sig := <-in:
				if n++; n > 1 {
					cancel()
					return
				}
				select {
				case out <- sig:
				default:
				}
			}
		}
	}()
	return out
}

// eofOnTTY reads r, then the terminal's EOF character (^D) where r ends:
// once at the start of a line, twice after a partial one (the first only
// hands the partial line to the reader).
type eofOnTTY struct {
	r    io.Reader
	last byte
	tail []byte
}

func (e *eofOnTTY) Read(p []byte) (int, error) {
	if e.r != nil {
		n, err := e.r.Read(p)
		if n > 0 {
			e.last = p[n-1]
		}
		if err != io.EOF {
			return n, err
		}
		e.r, e.tail = nil, []byte{0x04}
		if e.last != 0 && e.last != '\n' {
			e.tail = []byte{0x04, 0x04}
		}
		if n > 0 {
			return n, nil
		}
	}
	if len(e.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.tail)
	e.tail = e.tail[n:]
	return n, nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}
