package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Dial connects to TCP port on the sandbox's loopback (127.0.0.1:port)
// through the agent's connection, so it reaches every sandbox whatever its
// network. The returned connection is a stream on one channel, under the
// channel's flow control; CloseWrite half-closes it. Nothing listening on
// the port is an Unavailable error that says so; a port out of 1-65535 is
// InvalidArgument.
func (c *Conn) Dial(ctx context.Context, port int) (*StreamConn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.New(errdefs.InvalidArgument, "port %d is out of range: use 1 to 65535", port)
	}
	ch, err := c.openStarted(ctx, wire.Request{Op: wire.OpDial, Port: port, Stdin: true},
		errdefs.New(errdefs.Unavailable, "port %d: the agent closed the connection at once", port))
	if err != nil {
		return nil, err
	}
	return &StreamConn{ch: ch, port: port}, nil
}

// openStarted opens a channel for req and waits until the agent started
// it. A channel the agent ended at once instead is the error its exit
// says, or atOnce when it says none.
func (c *Conn) openStarted(ctx context.Context, req wire.Request, atOnce error) (*call, error) {
	ch, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := ch.waitStarted(ctx); err != nil {
		ch.close()
		return nil, err
	}
	select {
	case <-ch.started:
		return ch, nil
	default:
	}
	exit, err := ch.wait(ctx)
	if err == nil {
		err = exitError(exit)
	}
	if err == nil {
		err = atOnce
	}
	return nil, err
}

// StreamConn is a connection to a port inside a sandbox (see Conn.Dial). It
// is a net.Conn; deadlines are not supported (they return an error) and
// its addresses are nominal.
type StreamConn struct {
	ch   *call
	port int
	once sync.Once
}

var _ net.Conn = (*StreamConn)(nil)

// Read reads what the sandbox's side sent; io.EOF once it closed its
// write side.
func (s *StreamConn) Read(p []byte) (int, error) { return s.ch.stdout.Read(p) }

// Write sends p to the sandbox's side, waiting while its window is used
// up.
func (s *StreamConn) Write(p []byte) (int, error) {
	n, err := s.ch.stdin.Write(p)
	if err != nil {
		return n, fmt.Errorf("write to port %d in the sandbox: %w", s.port, err)
	}
	return n, nil
}

// CloseWrite half-closes the connection: the sandbox's side reads EOF.
func (s *StreamConn) CloseWrite() error { return s.ch.stdin.Close() }

// Close drops the connection both ways. It is safe to call more than once.
func (s *StreamConn) Close() error {
	s.once.Do(func() {
		s.ch.close()
		s.ch.stdin.Abort(net.ErrClosed)
	})
	return nil
}

// Done is closed once the connection has ended both ways.
func (s *StreamConn) Done() <-chan struct{} { return s.ch.done }

type sandboxAddr string

func (a sandboxAddr) Network() string { return "clade" }
func (a sandboxAddr) String() string  { return string(a) }

// LocalAddr is nominal: the connection has no host address.
func (s *StreamConn) LocalAddr() net.Addr { return sandboxAddr("host") }

// RemoteAddr names the port inside the sandbox.
func (s *StreamConn) RemoteAddr() net.Addr {
	return sandboxAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)))
}

var errNoDeadline = errors.New("deadlines are not supported on a sandbox port connection")

// SetDeadline and friends accept only the zero time (no deadline).
func (s *StreamConn) SetDeadline(t time.Time) error      { return noDeadline(t) }
func (s *StreamConn) SetReadDeadline(t time.Time) error  { return noDeadline(t) }
func (s *StreamConn) SetWriteDeadline(t time.Time) error { return noDeadline(t) }

func noDeadline(t time.Time) error {
	if t.IsZero() {
		return nil
	}
	return errNoDeadline
}
