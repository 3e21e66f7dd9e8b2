package qemu

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/guest"
)

// link keeps a sandbox's agent connected: it dials the unix socket behind
// the VM's virtio-serial port (QEMU listens on it) and serves each
// connection with the sandbox's guest.Conn.
//
// A virtio port has no connections of its own (see internal/agent/vport.go):
// one socket connection is one agent session. The agent says hello first;
// a connection that stays silent is dropped and dialled again (the guest
// sees the host go and come back, and its agent says hello again), which
// heals a hello lost in a race with a snapshot. Until the hello comes the
// link nudges the agent (see nudge): an agent that quiesced for a snapshot
// says hello to the first host that does. During a checkpoint the
// link is paused: nothing dials, so the agent's next hello waits in the
// guest and goes to whichever host (parent or restored child) connects next.
type link struct {
	path string
	conn *guest.Conn

	mu       sync.Mutex
	cur      net.Conn
	paused   bool
	resume   chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	// firstWait bounds the wait for the first hello (a boot takes
	// seconds under TCG); later waits start at a second.
	firstWait time.Duration
	// silent counts connections dropped for want of a hello (debug log).
	silent atomic.Int32
	// noNudge turns the nudges off (TestForkLevers measures without them).
	noNudge bool
}

func newLink(path string, conn *guest.Conn, firstWait time.Duration) *link {
	return &link{path: path, conn: conn, resume: make(chan struct{}), stop: make(chan struct{}), firstWait: firstWait}
}

// bufConn is a net.Conn whose reads go through a bufio.Reader that already
// holds the first bytes.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (l *link) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *link) sleep(d time.Duration) bool {
	select {
	case <-l.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (l *link) run() {
	wait := l.firstWait
	for !l.stopped() {
		l.mu.Lock()
		for l.paused {
			ch := l.resume
			l.mu.Unlock()
			select {
			case <-ch:
			case <-l.stop:
				return
			}
			l.mu.Lock()
		}
		l.mu.Unlock()
		nc, err := net.Dial("unix", l.path)
		if err != nil {
			if !l.sleep(20 * time.Millisecond) {
				return
			}
			continue
		}
		l.mu.Lock()
		if l.paused || l.stopped() {
			l.mu.Unlock()
			nc.Close()
			continue
		}
		l.cur = nc
		l.mu.Unlock()
		br := bufio.NewReaderSize(nc, 64<<10)
		_ = nc.SetReadDeadline(time.Now().Add(wait))
		stopNudge, nudged := l.nudge(nc)
		_, err = br.Peek(1)
		if err != nil {
			l.drop(nc) // unblocks a nudge's write
			close(stopNudge)
			<-nudged
			if errors.Is(err, os.ErrDeadlineExceeded) {
				l.silent.Add(1)
				wait = min(max(wait*2, time.Second), 8*time.Second)
				// Give the guest time to see the host go before it comes
				// back, or its agent may not notice.
				l.sleep(100 * time.Millisecond)
			} else {
				l.sleep(20 * time.Millisecond)
			}
			continue
		}
		// No nudge may be written once the session writes frames.
		close(stopNudge)
		<-nudged
		_ = nc.SetReadDeadline(time.Time{})
		wait = time.Second
		_ = l.conn.Serve(&bufConn{Conn: nc, r: br})
		l.drop(nc)
	}
}

// nudgeEvery is how often a connection that has not heard the agent's hello
// writes wire.Nudge again: one written before the guest's end of the port
// is ready again (in a VM just restored) is lost.
var nudgeEvery = 50 * time.Millisecond

// nudge writes wire.Nudge to nc now and every nudgeEvery until stop is
// closed (or a write fails); done is closed when it has stopped writing.
// An agent that quiesced for a snapshot says hello when it reads one,
// rather than when its wait for the old host's hang-up runs out: in a
// restored VM that hang-up never shows, and the wait was a second of
// every fork child's start. With l.noNudge it writes nothing.
func (l *link) nudge(nc net.Conn) (stop, done chan struct{}) {
	stop, done = make(chan struct{}), make(chan struct{})
	if l.noNudge {
		close(done)
		return stop, done
	}
	go func() {
		defer close(done)
		t := time.NewTicker(nudgeEvery)
		defer t.Stop()
		for {
			if _, err := nc.Write(wire.Nudge()); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return stop, done
}

// drop closes nc and forgets it if it is the current connection.
func (l *link) drop(nc net.Conn) {
	l.mu.Lock()
	if l.cur == nc {
		l.cur = nil
	}
	l.mu.Unlock()
	nc.Close()
}

// pause stops dialling; the current connection stays until dropped.
func (l *link) pause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.paused {
		l.paused = true
		l.resume = make(chan struct{})
	}
}

// unpause dials again.
func (l *link) unpause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.paused {
		l.paused = false
		close(l.resume)
	}
}

// dropCurrent closes the current connection, if any.
func (l *link) dropCurrent() {
	l.mu.Lock()
	nc := l.cur
	l.cur = nil
	l.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

// close stops the link for good.
func (l *link) close() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.dropCurrent()
}
