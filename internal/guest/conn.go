// Package guest is the host side of clade's agent protocol: the one seam
// between the host and what runs inside a sandbox. An engine hands the
// lifecycle a *Conn per sandbox; fronts (the HTTP API, image builds) use its
// typed operations (Exec, CopyIn, CopyOut, Stat, Reconfigure) and never see
// the agent's wire frames (package internal/agent/wire), which only this
// package and the agent share.
package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Conn is the host side of one sandbox's agent. The agent may reconnect at
// any time (daemon restart, restore); Serve takes each new connection, and
// the calls in flight on the old one fail with an Unavailable error (or the
// reason given to Close).
type Conn struct {
	mu      sync.Mutex
	cur     *session
	changed chan struct{} // closed and replaced whenever cur changes, and at Close and Retire
	closed  bool
	reason  error // why Close was called; set with closed
	// retired is set while the sandbox is out of service for a sleep
	// (Retire): calls are refused before they start, ErrRetired.
	retired bool
	closing chan struct{} // closed by the first Close
	hello   wire.HelloMsg
	// pending holds connections still in their hello, with when each
	// came: Quiesce must close them too, or a checkpoint could catch one.
	pending map[net.Conn]time.Time
	// The agent's keys (see auth.go): key is the one it holds, oldKeys
	// are accepted too until it acknowledges key; trustFirst takes a
	// hello without a key (a fresh boot, until the first channel opens).
	key        []byte
	oldKeys    [][]byte
	trustFirst bool
	// legacy accepts an agent that does not authenticate (Auth.Legacy).
	legacy bool
	save   func([][]byte) error
	// observe, if set, hears of every exec's start and end.
	observe func(ExecEvent)
}

// NewConn returns a Conn with no connection yet, for a sandbox that boots
// afresh: it takes its agent's first hello on trust (see Authenticate for
// a restored one).
func NewConn() *Conn {
	return &Conn{changed: make(chan struct{}), closing: make(chan struct{}), pending: map[net.Conn]time.Time{}, trustFirst: true}
}

// ErrClosed is what calls fail with after Close without a reason.
var ErrClosed = errdefs.New(errdefs.Unavailable, "agent connection closed")

// lostGrace is how long calls in flight on a connection that broke by
// surprise wait for the lifecycle to say why (Close with a reason: the
// sandbox was memory-killed or removed) before they fail with a bare
// "connection lost". It only delays failures that are happening anyway.
var lostGrace = 2 * time.Second

// helloTimeout bounds the wait for a new connection's hello.
const helloTimeout = 10 * time.Second

// maxPending bounds the connections waiting for their hello: past it the
// oldest is dropped. Only another process in the sandbox dials and stays
// silent; the agent says hello at once, so it is never the oldest for long.
const maxPending = 8

// session is one agent connection and the calls open on it.
type session struct {
	owner     *Conn
	conn      *wire.Conn
	quiescing atomic.Bool
	// frozen is set when the agent stopped answering pings while connected
	// (e.g. `kill -STOP 1`): calls then fail fast until it answers again.
	frozen atomic.Bool

	mu     sync.Mutex
	next   uint32
	calls  map[uint32]*call
	err    error
	pongs  map[string]chan struct{}
	closed chan struct{}
}

// Serve reads the agent's hello from nc, makes it the current connection
// and serves it until it breaks; it returns then, with the error that ended
// it. It closes nc. A connection whose hello does not prove it comes from
// the sandbox's agent (see Auth) is closed at once with an error that
// IsRejected reports, and leaves the current connection alone; so does
// one that breaks the protocol later, which ends only itself.
func (c *Conn) Serve(nc net.Conn) error {
	c.mu.Lock()
	if len(c.pending) >= maxPending {
		var oldest net.Conn
		var at time.Time
		for p, t := range c.pending {
			if oldest == nil || t.Before(at) {
				oldest, at = p, t
			}
		}
		delete(c.pending, oldest)
		oldest.Close()
	}
	c.pending[nc] = time.Now()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, nc)
		c.mu.Unlock()
	}()
	growSendBuffer(nc)
	r := wire.NewReader(nc)
	_ = nc.SetReadDeadline(time.Now().Add(helloTimeout))
	f, err := r.Read()
	if err != nil {
		nc.Close()
		return fmt.Errorf("read hello: %w", err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	var h wire.HelloMsg
	if f.Type != wire.Hello || json.Unmarshal(f.Payload, &h) != nil {
		nc.Close()
		return fmt.Errorf("%w: no hello (got %v)", ErrRejected, f.Type)
	}
	if h.Version != wire.Version {
		nc.Close()
		return fmt.Errorf("agent speaks protocol %d, host %d: rebuild the agent", h.Version, wire.Version)
	}
	s := &session{owner: c, conn: wire.NewConn(nc), next: 1, calls: map[uint32]*call{}, pongs: map[string]chan struct{}{}, closed: make(chan struct{})}
	c.mu.Lock()
	if _, ok := c.pending[nc]; !ok {
		// Dropped meanwhile (Quiesce, or too many silent connections).
		c.mu.Unlock()
		nc.Close()
		return net.ErrClosed
	}
	delete(c.pending, nc)
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return c.reason
	}
	key, err := c.admitLocked(h)
	if err == nil && key != nil {
		// Before the connection is current, so before any Open: the
		// agent holds the key before it can start anything.
		err = s.conn.Write(wire.Key, 0, key)
	}
	if err != nil {
		c.mu.Unlock()
		nc.Close()
		return err
	}
	h.Key = nil
	old := c.cur
	c.cur = s
	c.hello = h
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	stopWatch := make(chan struct{})
	go s.watchdog(stopWatch)
	err = s.readLoop(r)
	close(stopWatch)
	s.conn.Close()
	lost := errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("agent connection lost: %w", err))
	if !s.quiescing.Load() && s.busy() {
		// Calls in flight: wait briefly for the reason (Close with one).
		t := time.NewTimer(lostGrace)
		select {
		case <-c.closing:
		case <-t.C:
		}
		t.Stop()
	}
	c.mu.Lock()
	if c.closed {
		lost = c.reason
	}
	if c.cur == s {
		c.cur = nil
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.mu.Unlock()
	s.fail(lost)
	return err
}

// Close drops the current connection and refuses new ones. Calls in flight
// and later calls fail with reason, which should say why (e.g. "sandbox X
// was removed"); a nil reason means ErrClosed. Only the first Close's reason
// counts; Close is idempotent.
func (c *Conn) Close(reason error) {
	if reason == nil {
		reason = ErrClosed
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.reason = reason
	close(c.closing)
	// Whoever waits for a connection learns of the Close now.
	close(c.changed)
	c.changed = make(chan struct{})
	s := c.cur
	c.mu.Unlock()
	if s != nil {
		s.conn.Close()
	}
}

// Boot returns how many times the agent had (re)connected since it started,
// as of its last hello: a restored sandbox reconnects with a higher count.
func (c *Conn) Boot() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello.Boot
}

// Ready waits until an agent connection is up. It returns an Unavailable
// error when ctx ends first, and the Close reason after Close.
func (c *Conn) Ready(ctx context.Context) error {
	_, err := c.session(ctx)
	return err
}

// session returns the current connection, waiting for one while there is
// none (e.g. while a restored agent redials). A retired Conn's agent does
// not come back: ErrRetired instead of the wait.
func (c *Conn) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, changed, closed, reason, retired := c.cur, c.changed, c.closed, c.reason, c.retired
		c.mu.Unlock()
		// Retired first: the sleep that retired it closes it once the
		// sandbox sleeps, and a call that comes after must still be told
		// it was refused unstarted (the caller retries it on the woken
		// sandbox), not that the connection closed.
		if retired && (closed || s == nil) {
			return nil, ErrRetired
		}
		if closed {
			return nil, reason
		}
		if s != nil {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("agent not connected: %w", ctx.Err()))
		case <-changed:
		}
	}
}

// Quiesce asks the agent to drop its connection before a snapshot and waits
// until it has. The caller must have stopped accepting new connections, or
// the agent reconnects at once. Calls in flight fail; their processes keep
// running in the sandbox. Quiescing a Conn with no connection returns nil;
// a timeout returns an Unavailable error.
func (c *Conn) Quiesce(ctx context.Context) error {
	c.mu.Lock()
	s := c.cur
	for nc := range c.pending {
		nc.Close() // mid-hello: the agent sees it fail and redials
	}
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	s.quiescing.Store(true)
	if err := s.conn.Write(wire.Quiesce, 0, nil); err != nil {
		s.conn.Close()
		return nil // the connection is gone either way
	}
	select {
	case <-s.closed:
		return nil
	case <-ctx.Done():
		s.conn.Close()
		return errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("agent did not quiesce: %w", ctx.Err()))
	}
}

// ErrRetired refuses a call, before anything of it reaches the agent, on
// the connection of a sandbox taken out of service for a sleep (Retire).
// Nothing ran: the caller looks the sandbox up again, which waits for the
// sleep and wakes it (or, not waking, finds it asleep).
var ErrRetired = errdefs.New(errdefs.Unavailable, "the sandbox was put to sleep before the call started: retry (the next call wakes it)")

// IsRetired reports whether err is ErrRetired: a call refused, unstarted,
// by a sandbox going to sleep.
func IsRetired(err error) bool { return errors.Is(err, ErrRetired) }

// Retire takes the connection out of service for a sleep of its sandbox:
// calls opened from then on fail at once with ErrRetired, and so do those
// waiting for the agent to connect. Unless force, it does so only if no
// call counted by Active is open, and reports whether it did: the check
// and the refusal of later calls are one step, so a call is either open
// (the sleeper backs off) or refused. With force (a sleep asked for) the
// calls open go on until the sleep cuts them. Unretire undoes it.
func (c *Conn) Retire(force bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.cur; !force && s != nil {
		s.mu.Lock()
		n := s.activeLocked()
		s.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	c.retired = true
	close(c.changed) // waiters for a connection are refused now
	c.changed = make(chan struct{})
	return true
}

// Unretire puts a retired connection back in service (its sandbox's
// sleep failed, and it runs on).
func (c *Conn) Unretire() {
	c.mu.Lock()
	c.retired = false
	c.mu.Unlock()
}

// errAgentQuiesced ends a session the agent hung up after a Quiesce.
var errAgentQuiesced = errors.New("the agent hung up for a snapshot")

// errNotResponding is the message of a failed liveness check.
const errNotResponding = "agent is not responding (stopped? `kill -STOP 1` inside the sandbox freezes it)"

// Ping round-trips a ping frame on the current connection, waiting for one
// while there is none. It returns an Unavailable error when the connection
// breaks or ctx ends before the answer: an agent that is connected but does
// not answer in time is frozen.
func (c *Conn) Ping(ctx context.Context) error {
	s, err := c.session(ctx)
	if err != nil {
		return err
	}
	return s.ping(ctx)
}

func (s *session) ping(ctx context.Context) error {
	key := fmt.Sprint(time.Now().UnixNano())
	ch := make(chan struct{})
	s.mu.Lock()
	s.pongs[key] = ch
	s.mu.Unlock()
	defer func() { s.mu.Lock(); delete(s.pongs, key); s.mu.Unlock() }()
	if err := s.conn.Write(wire.Ping, 0, []byte(key)); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err)
	}
	select {
	case <-ch:
		return nil
	case <-s.closed:
		return s.err
	case <-ctx.Done():
		return errdefs.New(errdefs.Unavailable, "%s: no answer to a ping: %v", errNotResponding, ctx.Err())
	}
}

// watchdogEvery is how often a connection with calls in flight checks
// that the agent still answers; a check waits pingTimeout.
const watchdogEvery = 5 * time.Second

// watchdog fails the calls in flight when the agent stops answering pings
// while its connection stays up: a frozen agent would leave them hanging
// forever.
func (s *session) watchdog(stop <-chan struct{}) {
	t := time.NewTicker(watchdogEvery)
	defer t.Stop()
	misses := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !s.busy() || s.quiescing.Load() {
			misses = 0
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		err := s.ping(ctx)
		cancel()
		if err == nil || !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), errNotResponding) {
			misses = 0
			continue
		}
		// Calls in flight are failed only after two misses in a row: one
		// can be a host too loaded to schedule the agent.
		if misses++; misses >= 2 {
			s.frozen.Store(true)
			s.failCalls(err)
		}
	}
}

// open starts a request on a new channel of the current connection.
func (c *Conn) open(ctx context.Context, req wire.Request) (*call, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	if s.frozen.Load() {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := s.ping(pctx)
		cancel()
		if err != nil {
			return nil, err
		}
		s.frozen.Store(false)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var obs *execObserver
	// c.mu is held until the call is in s.calls: Retire's look at the
	// calls open and its refusal of new ones are one step.
	c.mu.Lock()
	if c.retired {
		c.mu.Unlock()
		return nil, ErrRetired
	}
	// From now on processes other than the agent may run in the sandbox:
	// a hello without a key is no longer the agent's.
	c.trustFirst = false
	if f := c.observe; req.Op == wire.OpExec && f != nil {
		obs = &execObserver{f: f, argv: req.Argv, tty: req.TTY}
	}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		c.mu.Unlock()
		return nil, s.err
	}
	id := s.next
	s.next++
	ch := &call{s: s, id: id, dial: req.Op == wire.OpDial, started: make(chan struct{}), done: make(chan struct{}), obs: obs, tty: req.TTY,
		stdout: wire.NewReceiver(s.conn, id, wire.Stdout),
		stderr: wire.NewReceiver(s.conn, id, wire.Stderr)}
	if req.Stdin {
		ch.stdin = wire.NewSender(s.conn, id, wire.Stdin)
	}
	s.calls[id] = ch
	s.mu.Unlock()
	c.mu.Unlock()
	if err := s.conn.Write(wire.Open, id, body); err != nil {
		s.conn.Close()
		return nil, errdefs.Wrap(errdefs.Unavailable, err)
	}
	return ch, nil
}

func (s *session) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls) > 0
}

func (s *session) readLoop(r *wire.Reader) error {
	for {
		f, err := r.Read()
		if err != nil {
			return err
		}
		if f.Type == wire.Quiesce {
			// The agent acknowledges a quiesce and hangs up.
			return errAgentQuiesced
		}
		if f.Type == wire.Key {
			// The agent holds the key it was handed.
			s.owner.keyAcked(s)
			continue
		}
		if f.Type == wire.Pong {
			s.mu.Lock()
			if ch, ok := s.pongs[string(f.Payload)]; ok {
				delete(s.pongs, string(f.Payload))
				close(ch)
			}
			s.mu.Unlock()
			continue
		}
		switch f.Type {
		case wire.Started, wire.Stdout, wire.Stderr, wire.Window, wire.Exit:
		default:
			// Never sent by an agent (on any channel): not one.
			return fmt.Errorf("%w: unexpected %v frame from the agent", wire.ErrFrame, f.Type)
		}
		s.mu.Lock()
		ch := s.calls[f.Channel]
		s.mu.Unlock()
		if ch == nil {
			continue
		}
		switch f.Type {
		case wire.Started:
			select {
			case <-ch.started:
				return fmt.Errorf("%w: a second started frame on channel %d", wire.ErrFrame, f.Channel)
			default:
			}
			var st wire.StartedMsg
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return fmt.Errorf("%w: started frame: %v", wire.ErrFrame, err)
			}
			ch.pid = st.PID
			ch.obs.started(st.PID) // first: whoever the start wakes sees it told
			close(ch.started)
		case wire.Stdout:
			if err := ch.stdout.Push(f.Payload); err != nil {
				return err
			}
		case wire.Stderr:
			if err := ch.stderr.Push(f.Payload); err != nil {
				return err
			}
		case wire.Window:
			st, n, err := wire.ParseWindow(f.Payload)
			if err != nil {
				return err
			}
			if st == wire.Stdin && ch.stdin != nil {
				ch.stdin.Grant(n)
			}
		case wire.Exit:
			var exit wire.ExitMsg
			if err := json.Unmarshal(f.Payload, &exit); err != nil {
				return fmt.Errorf("exit frame: %w", err)
			}
			s.mu.Lock()
			_, ok := s.calls[f.Channel]
			delete(s.calls, f.Channel)
			s.mu.Unlock()
			if !ok {
				continue // failed meanwhile (failCalls)
			}
			ch.exit = exit
			// The agent sends both streams' EOF before Exit; these are no-ops
			// then, and unblock readers if it did not.
			ch.stdout.Push(nil)
			ch.stderr.Push(nil)
			if ch.stdin != nil {
				ch.stdin.Abort(io.ErrClosedPipe)
			}
			ch.obs.ended(ch.startedPID(), exit, nil) // first: the end is told before anyone learns it
			close(ch.done)
		default:
			return fmt.Errorf("unexpected %v frame from agent", f.Type)
		}
	}
}

// fail ends the session for good: calls in flight and later ones fail with
// err.
func (s *session) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
		close(s.closed)
	}
	s.mu.Unlock()
	s.failCalls(err)
}

// failCalls fails the calls in flight with err.
func (s *session) failCalls(err error) {
	s.mu.Lock()
	calls := s.calls
	s.calls = map[uint32]*call{}
	s.mu.Unlock()
	for _, ch := range calls {
		ch.err = err
		ch.stdout.CloseWithError(err)
		ch.stderr.CloseWithError(err)
		if ch.stdin != nil {
			ch.stdin.Abort(err)
		}
		ch.obs.ended(ch.startedPID(), wire.ExitMsg{}, err)
		close(ch.done)
	}
}

// call is one request in flight on a channel.
type call struct {
	s       *session
	id      uint32
	dial    bool         // a port connection (OpDial)
	tty     bool         // an exec on a terminal: only it may be sent Resize
	stdin   *wire.Sender // nil unless the request set Stdin
	stdout  *wire.Receiver
	stderr  *wire.Receiver
	pid     int
	started chan struct{}
	done    chan struct{}
	exit    wire.ExitMsg
	err     error
	obs     *execObserver // nil unless an exec is observed
}

// wait returns the call's exit, or the error that lost it. A ctx that ends
// first closes the call.
func (ch *call) wait(ctx context.Context) (wire.ExitMsg, error) {
	select {
	case <-ch.done:
		return ch.exit, ch.err
	case <-ctx.Done():
		ch.close()
		return wire.ExitMsg{}, ctx.Err()
	}
}

// close tells the agent to kill what runs on the channel and forget it. It
// is safe after the call ended.
func (ch *call) close() {
	select {
	case <-ch.done:
		return
	default:
	}
	_ = ch.s.conn.Write(wire.Close, ch.id, nil)
	ch.stdout.CloseWithError(errors.New("channel closed"))
	ch.stderr.CloseWithError(errors.New("channel closed"))
}

// exitError turns a failed exit of a non-exec op into a classed error.
func exitError(e wire.ExitMsg) error {
	if e.Error == "" {
		return nil
	}
	return errdefs.New(errdefs.Class(e.ErrorClass), "%s", e.Error)
}

// Active returns how many calls (execs, file transfers) are open on the
// current connection. Port connections (Dial) do not count: a proxy may
// keep idle ones open, and whoever proxies says itself when it is busy.
func (c *Conn) Active() int {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.activeLocked()
}

// activeLocked is Active's count on s. Guarded by s.mu.
func (s *session) activeLocked() int {
	n := 0
	for _, ch := range s.calls {
		if !ch.dial {
			n++
		}
	}
	return n
}

// sendBuffer is the socket send buffer the host asks for on an agent's
// connection: a whole push window (plus room for other frames), so that
// the host's writes of a push never wait for the agent's reads, which
// gVisor hands over in pieces of at most the agent side's own buffer
// (about 200 KiB).
const sendBuffer = wire.BulkWindow + 64<<10

// growSendBuffer sets nc's send buffer to sendBuffer, past the host's
// net.core.wmem_max when the daemon may (root); failing that, it leaves
// the default.
func growSendBuffer(nc net.Conn) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sendBuffer)
		}
	})
}
