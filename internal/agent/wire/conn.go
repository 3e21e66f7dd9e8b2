package wire

import (
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
	buf []byte
	err error
}

// NewConn wraps nc for writing frames.
func NewConn(nc net.Conn) *Conn {
	return &Conn{nc: nc}
}

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// copyMax is the largest payload Write copies behind its header; a larger
// one goes out with it in one writev, uncopied.
const copyMax = 32 << 10

// Write sends one frame in one system call (two when the peer's socket is
// full). After the first write error every later call returns that error.
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
	var err error
	if len(payload) <= copyMax {
		c.buf = append(c.buf, payload...)
		_, err = c.nc.Write(c.buf)
	} else {
		bufs := net.Buffers{c.buf, payload}
		_, err = bufs.WriteTo(c.nc)
	}
	if cap(c.buf) > 2*copyMax {
		c.buf = nil
	}
	if err != nil {
		c.err = err
	}
	return err
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

// ackEvery is how much a Receiver's consumer reads before the sender gets
// that credit back with the initial window: half of it, so a bulk stream
// costs the receiver a Window frame (a system call) per 512 KiB, while the
// sender, with the other half still to send, never waits for it. A wider
// window acknowledges by its quarter.
const ackEvery = InitialWindow / 2

// BulkWindow is the window the receiving end of a file transfer grants
// (Receiver.Widen): the initial window, then the rest in a Window frame
// sent as the channel opens, which any peer takes as credit. With 1 MiB in
// flight a push or a pull stalls whenever one of the goroutines and
// threads on its way is late to run, as on a loaded host they are.
const BulkWindow = 4 << 20

// chunkPool recycles the buffers of data payloads of ChunkSize bytes, the
// bulk streams' frames: a transfer of 1 GiB would otherwise allocate (and
// the Go runtime zero, and gVisor fault in) 4,096 of them.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

// Receiver buffers one incoming stream and returns credit to the sender as
// the consumer reads. Its buffer never exceeds the window: a peer that
// overruns it gets ErrWindow from Push and should be disconnected.
type Receiver struct {
	c      *Conn
	ch     uint32
	stream Type

	mu       sync.Mutex
	cond     *sync.Cond
	window   int // the credit granted in all: InitialWindow unless widened
	bufs     []rbuf
	buffered int
	unacked  uint32
	eof      bool
	err      error
}

// rbuf is a queued payload: b is what is left to read, pooled the buffer
// to give back to chunkPool once it is read.
type rbuf struct {
	b      []byte
	pooled *[]byte
}

// NewReceiver returns a Receiver that acknowledges through c.
func NewReceiver(c *Conn, ch uint32, stream Type) *Receiver {
	r := &Receiver{c: c, ch: ch, stream: stream, window: InitialWindow}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Widen grants the sender window bytes of credit in all (more than the
// initial window) with a Window frame. Call it once, before any data is
// read.
func (r *Receiver) Widen(window int) error {
	r.mu.Lock()
	extra := window - r.window
	if extra > 0 {
		r.window = window
	}
	r.mu.Unlock()
	if extra <= 0 {
		return nil
	}
	return r.c.Write(Window, r.ch, WindowPayload(r.stream, uint32(extra)))
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
	if r.buffered+len(p) > r.window {
		return ErrWindow
	}
	var q rbuf
	if len(p) > ChunkSize/2 && len(p) <= ChunkSize {
		q.pooled = chunkPool.Get().(*[]byte)
		q.b = (*q.pooled)[:copy(*q.pooled, p)]
	} else {
		q.b = append([]byte(nil), p...)
	}
	r.bufs = append(r.bufs, q)
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

// waitLocked waits until data is queued or the stream ended; it returns
// the error to end the read with (io.EOF at a clean end) when nothing is
// queued.
func (r *Receiver) waitLocked() error {
	for len(r.bufs) == 0 && !r.eof && r.err == nil {
		r.cond.Wait()
	}
	if len(r.bufs) > 0 {
		return nil
	}
	if r.eof || r.err == nil {
		return io.EOF
	}
	return r.err
}

// consumedLocked counts n bytes read and returns the credit to send back
// now, if any.
func (r *Receiver) consumedLocked(n int) uint32 {
	r.buffered -= n
	r.unacked += uint32(n)
	// Acknowledged by the half window, not after every read: the sender
	// blocks only once a whole window is unacknowledged, which is always
	// acknowledged here by then (a read that crosses a half acks).
	if r.unacked >= uint32(max(r.window/4, ackEvery)) {
		ack := r.unacked
		r.unacked = 0
		return ack
	}
	return 0
}

func (r *Receiver) ack(n uint32) {
	if n > 0 {
		// A failed ack means the connection is gone; the read loop reports it.
		_ = r.c.Write(Window, r.ch, WindowPayload(r.stream, n))
	}
}

// Read reads buffered data, blocking until some arrives or the stream ends.
func (r *Receiver) Read(p []byte) (int, error) {
	r.mu.Lock()
	if err := r.waitLocked(); err != nil {
		r.mu.Unlock()
		return 0, err
	}
	q := &r.bufs[0]
	n := copy(p, q.b)
	q.b = q.b[n:]
	if len(q.b) == 0 {
		if q.pooled != nil {
			chunkPool.Put(q.pooled)
		}
		r.bufs[0] = rbuf{}
		r.bufs = r.bufs[1:]
	}
	ack := r.consumedLocked(n)
	r.mu.Unlock()
	r.ack(ack)
	return n, nil
}

// WriteTo writes the stream to w until its end, each payload as it came,
// uncopied (io.Copy uses it). It returns nil at a clean end.
func (r *Receiver) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		r.mu.Lock()
		if err := r.waitLocked(); err != nil {
			r.mu.Unlock()
			if err == io.EOF {
				err = nil
			}
			return total, err
		}
		q := r.bufs[0]
		r.bufs[0] = rbuf{}
		r.bufs = r.bufs[1:]
		r.mu.Unlock()
		n, err := w.Write(q.b)
		total += int64(n)
		if n < len(q.b) && err == nil {
			err = io.ErrShortWrite
		}
		if q.pooled != nil && err == nil {
			chunkPool.Put(q.pooled)
		}
		r.mu.Lock()
		// All of it counts as read: on an error the caller stops reading,
		// and the rest goes with the stream.
		ack := r.consumedLocked(len(q.b))
		r.mu.Unlock()
		r.ack(ack)
		if err != nil {
			return total, err
		}
	}
}
