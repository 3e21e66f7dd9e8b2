package guest

import (
	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// ExecEvent tells an observer (SetObserver) that an exec started or ended.
type ExecEvent struct {
	// Ended is false for the start, true for the end.
	Ended bool
	Argv  []string
	TTY   bool
	// PID is the process's pid inside the sandbox; 0 if it never ran.
	PID int
	// Exit is how it ended (Ended only); Err is set instead when the
	// process was lost (the connection broke, the sandbox went away).
	Exit ExitStatus
	Err  error
}

// SetObserver makes f hear of the start and the end of every exec opened
// from now on (nil stops it). f runs on the connection's reader: it must
// not block or call back into the Conn.
func (c *Conn) SetObserver(f func(ExecEvent)) {
	c.mu.Lock()
	c.observe = f
	c.mu.Unlock()
}

// execObserver reports one exec's start and end; a nil one does nothing.
type execObserver struct {
	f    func(ExecEvent)
	argv []string
	tty  bool
}

func (o *execObserver) started(pid int) {
	if o == nil {
		return
	}
	o.f(ExecEvent{Argv: o.argv, TTY: o.tty, PID: pid})
}

func (o *execObserver) ended(pid int, e wire.ExitMsg, err error) {
	if o == nil {
		return
	}
	o.f(ExecEvent{Ended: true, Argv: o.argv, TTY: o.tty, PID: pid, Err: err,
		Exit: ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, Error: e.Error, ErrorClass: errdefs.Class(e.ErrorClass)}})
}

// startedPID is the call's pid once it started, else 0.
func (ch *call) startedPID() int {
	select {
	case <-ch.started:
		return ch.pid
	default:
		return 0
	}
}

// hasFeature reports whether the connected agent's hello listed f.
func (c *Conn) hasFeature(f string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.hello.Features {
		if x == f {
			return true
		}
	}
	return false
}
