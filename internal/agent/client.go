package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Client is the host side of one sandbox's agent. The agent may reconnect at
// any time (daemon restart, restore); Serve takes each new connection and the
// calls in flight on the old one fail with an Unavailable error.
type Client struct {
	mu      sync.Mutex
	cur     *hostSession
	changed chan struct{} // closed and replaced whenever cur changes
	closed  bool
	hello   wire.HelloMsg
	// pending holds connections still in their hello: Quiesce must close
	// them too, or a checkpoint could catch one.
	pending map[net.Conn]struct{}
}

// NewClient returns a Client with no connection yet.
func NewClient() *Client {
	return &Client{changed: make(chan struct{}), pending: map[net.Conn]struct{}{}}
}

type hostSession struct {
	conn   *wire.Conn
	mu     sync.Mutex
	next   uint32
	chans  map[uint32]*Channel
	err    error
	pongs  map[string]chan struct{}
	closed chan struct{}
}

// ErrClosed is returned after Close.
var ErrClosed = errdefs.New(errdefs.Unavailable, "agent client closed")

// Serve reads the agent's hello from nc and makes it the current connection,
// then serves it until it breaks. It returns when the connection ends.
func (c *Client) Serve(nc net.Conn) error {
	c.mu.Lock()
	c.pending[nc] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, nc)
		c.mu.Unlock()
	}()
	br := bufio.NewReaderSize(nc, 64<<10)
	r := wire.NewReader(br)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := r.Read()
	if err != nil {
		nc.Close()
		return fmt.Errorf("read hello: %w", err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	var h wire.HelloMsg
	if f.Type != wire.Hello || json.Unmarshal(f.Payload, &h) != nil {
		nc.Close()
		return fmt.Errorf("agent did not say hello (got %v)", f.Type)
	}
	if h.Version != wire.Version {
		nc.Close()
		return fmt.Errorf("agent speaks protocol %d, host %d: rebuild the agent", h.Version, wire.Version)
	}
	s := &hostSession{conn: wire.NewConn(nc), next: 1, chans: map[uint32]*Channel{}, pongs: map[string]chan struct{}{}, closed: make(chan struct{})}
	c.mu.Lock()
	delete(c.pending, nc)
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return ErrClosed
	}
	old := c.cur
	c.cur = s
	c.hello = h
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	err = s.readLoop(r)
	s.fail(errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("agent connection lost: %w", err)))
	c.mu.Lock()
	if c.cur == s {
		c.cur = nil
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.mu.Unlock()
	return err
}

// Close drops the current connection and refuses new ones.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	s := c.cur
	c.cur = nil
	c.mu.Unlock()
	if s != nil {
		s.conn.Close()
	}
}

// Hello returns the last hello the agent sent.
func (c *Client) Hello() wire.HelloMsg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello
}

// Ready waits until an agent connection is up, or ctx ends.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.session(ctx)
	return err
}

// WaitReconnect waits for a connection other than the current one, e.g.
// after a restore broke the old one.
func (c *Client) session(ctx context.Context) (*hostSession, error) {
	for {
		c.mu.Lock()
		s, changed, closed := c.cur, c.changed, c.closed
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
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
// running in the sandbox.
func (c *Client) Quiesce(ctx context.Context) error {
	c.mu.Lock()
	s := c.cur
	for nc := range c.pending {
		nc.Close() // mid-hello: the agent sees it fail and redials
	}
	c.mu.Unlock()
	if s == nil {
		return nil // not connected: nothing to quiesce
	}
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

// Ping round-trips a ping frame.
func (c *Client) Ping(ctx context.Context) error {
	s, err := c.session(ctx)
	if err != nil {
		return err
	}
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
		return errdefs.Wrap(errdefs.Unavailable, s.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Open starts a request on a new channel.
func (c *Client) Open(ctx context.Context, req wire.Request) (*Channel, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	id := s.next
	s.next++
	ch := &Channel{s: s, id: id, started: make(chan struct{}), done: make(chan struct{}),
		Stdout: wire.NewReceiver(s.conn, id, wire.Stdout),
		Stderr: wire.NewReceiver(s.conn, id, wire.Stderr)}
	if req.Stdin {
		ch.Stdin = wire.NewSender(s.conn, id, wire.Stdin)
	}
	s.chans[id] = ch
	s.mu.Unlock()
	if err := s.conn.Write(wire.Open, id, body); err != nil {
		s.conn.Close()
		return nil, errdefs.Wrap(errdefs.Unavailable, err)
	}
	return ch, nil
}

func (s *hostSession) readLoop(r *wire.Reader) error {
	for {
		f, err := r.Read()
		if err != nil {
			return err
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
		s.mu.Lock()
		ch := s.chans[f.Channel]
		s.mu.Unlock()
		if ch == nil {
			continue
		}
		switch f.Type {
		case wire.Started:
			var st wire.StartedMsg
			_ = json.Unmarshal(f.Payload, &st)
			ch.pid = st.PID
			close(ch.started)
		case wire.Stdout:
			if err := ch.Stdout.Push(f.Payload); err != nil {
				return err
			}
		case wire.Stderr:
			if err := ch.Stderr.Push(f.Payload); err != nil {
				return err
			}
		case wire.Window:
			st, n, err := wire.ParseWindow(f.Payload)
			if err != nil {
				return err
			}
			if st == wire.Stdin && ch.Stdin != nil {
				ch.Stdin.Grant(n)
			}
		case wire.Exit:
			if err := json.Unmarshal(f.Payload, &ch.exit); err != nil {
				return fmt.Errorf("exit frame: %w", err)
			}
			s.mu.Lock()
			delete(s.chans, f.Channel)
			s.mu.Unlock()
			// The agent sends both streams' EOF before Exit; these are no-ops
			// then, and unblock readers if it did not.
			ch.Stdout.Push(nil)
			ch.Stderr.Push(nil)
			if ch.Stdin != nil {
				ch.Stdin.Abort(io.ErrClosedPipe)
			}
			close(ch.done)
		default:
			return fmt.Errorf("unexpected %v frame from agent", f.Type)
		}
	}
}

func (s *hostSession) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
		close(s.closed)
	}
	chans := s.chans
	s.chans = map[uint32]*Channel{}
	s.mu.Unlock()
	for _, ch := range chans {
		ch.Stdout.CloseWithError(err)
		ch.Stderr.CloseWithError(err)
		if ch.Stdin != nil {
			ch.Stdin.Abort(err)
		}
		ch.err = err
		close(ch.done)
	}
}

// Channel is one request in flight.
type Channel struct {
	s       *hostSession
	id      uint32
	Stdin   *wire.Sender // nil unless the request set Stdin
	Stdout  *wire.Receiver
	Stderr  *wire.Receiver
	pid     int
	started chan struct{}
	done    chan struct{}
	exit    wire.ExitMsg
	err     error
}

// Wait returns the channel's exit, or the error that lost it.
func (ch *Channel) Wait(ctx context.Context) (wire.ExitMsg, error) {
	select {
	case <-ch.done:
		return ch.exit, ch.err
	case <-ctx.Done():
		ch.Close()
		return wire.ExitMsg{}, ctx.Err()
	}
}

// Done is closed when the channel ended.
func (ch *Channel) Done() <-chan struct{} { return ch.done }

// Signal sends a signal to the channel's process.
func (ch *Channel) Signal(sig int) error {
	return ch.s.conn.Write(wire.Signal, ch.id, putUint32(uint32(sig)))
}

// Close tells the agent to kill what runs on the channel and forget it. It is
// safe after the channel ended.
func (ch *Channel) Close() {
	select {
	case <-ch.done:
		return
	default:
	}
	_ = ch.s.conn.Write(wire.Close, ch.id, nil)
	ch.Stdout.CloseWithError(errors.New("channel closed"))
	ch.Stderr.CloseWithError(errors.New("channel closed"))
}

// ExitError turns a failed exit of a non-exec op into a classed error.
func ExitError(e wire.ExitMsg) error {
	if e.Error == "" {
		return nil
	}
	return errdefs.New(errdefs.Class(e.ErrorClass), "%s", e.Error)
}

// Active returns how many requests (execs, file transfers) are open on the
// current connection.
func (c *Client) Active() int {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.chans)
}
