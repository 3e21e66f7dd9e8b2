package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
)

// Conn writes frames on a connection; safe for concurrent use. Reading is
// left to one goroutine per connection using a Reader.
type Conn struct {
	nc  net.Conn
	mu  sync.Mutex
	bw  *bufio.Writer
	buf []byte
	err error
}

// NewConn wraps nc for writing frames.
func NewConn(nc net.Conn) *Conn {
	return &Conn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10)}
}

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Write sends one frame and flushes it. After the first write error every
// later call returns that error.
func (c *Conn) Write(t Type, ch uint32, payload []byte) error {
	if len(payload) > MaxPayload {
		return errors.New("wire: payload too large")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.buf = AppendHeader(c.buf[:0], t, ch, len(payload))
	if _, err := c.bw.Write(c.buf); err != nil {
		c.err = err
		return err
	}
	if _, err := c.bw.Write(payload); err != nil {
		c.err = err
		return err
	}
	if err := c.bw.Flush(); err != nil {
		c.err = err
		return err
	}
	return nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// WindowPayload encodes a Window frame's payload.
func WindowPayload(stream Type, n uint32) []byte {
	b := make([]byte, 5)
	b[0] = byte(stream)
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

// ParseWindow decodes a Window frame's payload.
func ParseWindow(p []byte) (Type, uint32, error) {
	if len(p) != 5 {
		return 0, 0, ErrFrame
	}
	return Type(p[0]), binary.BigEndian.Uint32(p[1:]), nil
}

// ChunkSize is the largest data payload a Sender puts in one frame: a
// quarter of the window, so a bulk stream costs a write and an
// acknowledgement per 256 KiB (at 32 KiB, frame and ack overheads held
// file transfers under 100 MiB/s).
const ChunkSize = InitialWindow / 4

// Sender writes one stream of a channel under the receiver's credit: it never
// has more than the granted window in flight.
type Sender struct {
	c      *Conn
	ch     uint32
	stream Type

	mu     sync.Mutex
	cond   *sync.Cond
	credit int64
	err    error
	closed bool
}

// NewSender returns a Sender with the initial window.
func NewSender(c *Conn, ch uint32, stream Type) *Sender {
	s := &Sender{c: c, ch: ch, stream: stream, credit: InitialWindow}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Grant adds credit, from a Window frame.
func (s *Sender) Grant(n uint32) {
	s.mu.Lock()
	s.credit += int64(n)
	s.mu.Unlock()
	s.cond.Broadcast()
}

// Abort makes pending and future writes fail with err.
func (s *Sender) Abort(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// Write sends p as data frames, blocking while the window is used up.
func (s *Sender) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		s.mu.Lock()
		for s.credit <= 0 && s.err == nil {
			s.cond.Wait()
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return n, err
		}
		k := min(int64(len(p)), s.credit, ChunkSize)
		s.credit -= k
		s.mu.Unlock()
		if err := s.c.Write(s.stream, s.ch, p[:k]); err != nil {
			s.Abort(err)
			return n, err
		}
		n += int(k)
		p = p[k:]
	}
	return n, nil
}

// MarkClosed ends the stream without a frame: the channel's Exit frame,
// sent next, ends every stream of the channel for the host, so a short
// channel (an exec of `true`, a stat) costs one write, not three. Later
// Close calls send nothing.
func (s *Sender) MarkClosed() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Close sends end-of-stream (an empty data frame) once.
func (s *Sender) Close() error {
	s.mu.Lock()
	if s.closed || s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	return s.c.Write(s.stream, s.ch, nil)
}

// ErrWindow means a peer sent more than its credit allowed.
var ErrWindow = errors.New("wire: peer exceeded its flow-control window")

// Receiver buffers one incoming stream and returns credit to the sender as
// the consumer reads. Its buffer never exceeds the window: a peer that
// overruns it gets ErrWindow from Push and should be disconnected.
type Receiver struct {
	c      *Conn
	ch     uint32
	stream Type

	mu       sync.Mutex
	cond     *sync.Cond
	bufs     [][]byte
	buffered int
	unacked  uint32
	eof      bool
	err      error
}

// NewReceiver returns a Receiver that acknowledges through c.
func NewReceiver(c *Conn, ch uint32, stream Type) *Receiver {
	r := &Receiver{c: c, ch: ch, stream: stream}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Push queues a data frame's payload (copied); an empty payload is EOF.
func (r *Receiver) Push(p []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(p) == 0 {
		r.eof = true
		r.cond.Broadcast()
		return nil
	}
	if r.eof || r.err != nil {
		return nil // late data after the consumer gave up: drop it
	}
	if r.buffered+len(p) > InitialWindow {
		return ErrWindow
	}
	r.bufs = append(r.bufs, append([]byte(nil), p...))
	r.buffered += len(p)
	r.cond.Broadcast()
	return nil
}

// CloseWithError ends the stream for the reader with err (io.EOF for a clean
// end).
func (r *Receiver) CloseWithError(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Read reads buffered data, blocking until some arrives or the stream ends.
func (r *Receiver) Read(p []byte) (int, error) {
	r.mu.Lock()
	for len(r.bufs) == 0 && !r.eof && r.err == nil {
		r.cond.Wait()
	}
	if len(r.bufs) == 0 {
		err := r.err
		if r.eof || err == nil {
			err = io.EOF
		}
		r.mu.Unlock()
		return 0, err
	}
	n := copy(p, r.bufs[0])
	if n == len(r.bufs[0]) {
		r.bufs[0] = nil
		r.bufs = r.bufs[1:]
	} else {
		r.bufs[0] = r.bufs[0][n:]
	}
	r.buffered -= n
	r.unacked += uint32(n)
	var ack uint32
	// Acknowledged by the quarter window, not after every read: the sender
	// blocks only once a whole window is unacknowledged, which is always
	// acknowledged here by then (a read that crosses a quarter acks).
	if r.unacked >= InitialWindow/4 {
		ack, r.unacked = r.unacked, 0
	}
	r.mu.Unlock()
	if ack > 0 {
		// A failed ack means the connection is gone; the read loop reports it.
		_ = r.c.Write(Window, r.ch, WindowPayload(r.stream, ack))
	}
	return n, nil
}
