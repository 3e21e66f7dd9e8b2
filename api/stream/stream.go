// Package stream is the codec of clade's public exec stream: the frames an
// exec answers with on the HTTP API (a plain POST's body, or both ways on an
// `Upgrade: clade-stream` connection). It is part of the API, versioned by
// Version, and deliberately apart from the agent's internal wire protocol:
// the agent's frames may change without breaking a client.
//
// A frame is a 9-byte header followed by the payload:
//
//	type    uint8
//	channel uint32 big-endian (always 0 on the API; readers ignore it)
//	length  uint32 big-endian (at most MaxPayload)
//
// A reader ignores frame types it does not know: new types can be added
// without a new Version.
package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
)

// Version is the version of the stream this package speaks; it is bumped on
// an incompatible change to frames or payloads.
const Version = 1

// VersionHeader is the HTTP header that carries the stream version, in the
// exec request (optional; absent means 1) and in its response.
const VersionHeader = "Clade-Stream-Version"

// ContentType is the media type of a plain-mode exec response body.
const ContentType = "application/vnd.clade.stream"

// UpgradeProtocol is the Upgrade token of a two-way exec stream.
const UpgradeProtocol = "clade-stream"

// HeaderSize is the size of a frame header in bytes.
const HeaderSize = 9

// MaxPayload bounds one frame, so a corrupt or hostile length cannot make a
// reader allocate without limit.
const MaxPayload = 1 << 20

// ChunkSize is the largest data payload a writer of this package puts in one
// frame; readers accept up to MaxPayload.
const ChunkSize = 32 << 10

// Type is a frame type.
type Type uint8

const (
	// Started (daemon -> client): JSON api.Started, before any output of a
	// command that started. Optional; clients must not require it.
	Started Type = 3
	// Stdout (daemon -> client) and Stdin (client -> daemon, two-way mode
	// only) carry raw bytes; an empty payload is EOF of that stream.
	Stdout Type = 4
	Stdin  Type = 4
	// Stderr (daemon -> client): raw bytes; an empty payload is EOF.
	Stderr Type = 5
	// Signal (client -> daemon): SignalPayload, delivered to the command.
	Signal Type = 8
	// Exit (daemon -> client): JSON api.ExitStatus; the last frame.
	Exit Type = 9
	// Close (client -> daemon): give up; the command is killed and its Exit
	// frame follows.
	Close Type = 12
	// Resize (client -> daemon, two-way mode, a TTY exec only):
	// ResizePayload, the terminal's new size; the command gets SIGWINCH.
	// Ignored for an exec without a TTY (and by daemons that predate it).
	Resize Type = 14
)

// Frame is one decoded frame. Payload is only valid until the next Read on
// the same Reader.
type Frame struct {
	Type    Type
	Payload []byte
}

// ErrFrame marks a malformed frame (a length above MaxPayload); the reader
// must drop the connection.
var ErrFrame = errors.New("malformed stream frame")

// Reader decodes frames, reusing one buffer.
type Reader struct {
	r   io.Reader
	hdr [HeaderSize]byte
	buf []byte
}

// NewReader returns a Reader on r; wrap r in a bufio.Reader for small frames.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Read returns the next frame, of any type: callers skip types they do not
// know. It returns io.EOF at a clean end between frames,
// io.ErrUnexpectedEOF inside a frame and ErrFrame for an oversize length.
func (r *Reader) Read() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(r.hdr[5:9])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrFrame, n, MaxPayload)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	f := Frame{Type: Type(r.hdr[0]), Payload: r.buf[:n]}
	if _, err := io.ReadFull(r.r, f.Payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}

// AppendFrame appends the encoding of one frame to b.
func AppendFrame(b []byte, t Type, payload []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// Writer writes frames on one stream; safe for concurrent use. After the
// first error every later write returns it.
type Writer struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
	buf   []byte
	err   error
}

// NewWriter returns a Writer on w; flush, if not nil, runs after each frame
// (an HTTP response's Flush).
func NewWriter(w io.Writer, flush func() error) *Writer { return &Writer{w: w, flush: flush} }

// Write sends one frame. A payload above MaxPayload is refused.
func (f *Writer) Write(t Type, p []byte) error { return f.write(t, p, true) }

// WriteLast sends the stream's last frame (exit) without the flush: the
// end of the HTTP response flushes it together with the response's own
// end, so the client reads both at once and the connection is ready for
// its next request.
func (f *Writer) WriteLast(t Type, p []byte) error { return f.write(t, p, false) }

// WriteUnflushed sends one frame without the flush: it goes out with the
// next frame that flushes (a Started frame before the output).
func (f *Writer) WriteUnflushed(t Type, p []byte) error { return f.write(t, p, false) }

func (f *Writer) write(t Type, p []byte, flush bool) error {
	if len(p) > MaxPayload {
		return fmt.Errorf("stream: payload of %d bytes exceeds %d", len(p), MaxPayload)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.buf = AppendFrame(f.buf[:0], t, p)
	if _, err := f.w.Write(f.buf); err != nil {
		f.err = err
		return err
	}
	if flush && f.flush != nil {
		if err := f.flush(); err != nil {
			f.err = err
		}
	}
	return f.err
}

// Copy sends what r yields as frames of type t, in chunks of at most
// ChunkSize, until r ends; it returns the first write error, after which it
// keeps draining r so its producer is not blocked.
func (f *Writer) Copy(t Type, r io.Reader) error {
	buf := make([]byte, ChunkSize)
	var werr error
	for {
		n, err := r.Read(buf)
		if n > 0 && werr == nil {
			werr = f.Write(t, buf[:n])
		}
		if err != nil {
			return werr
		}
	}
}

// SignalPayload encodes a signal for a Signal frame: the Linux signal number
// as a uint32 big-endian. It is the one signal encoding of clade: the agent's
// wire uses it too.
func SignalPayload(sig syscall.Signal) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(sig))
}

// ParseSignal decodes a Signal frame's payload. It returns false for a
// payload of another length or a number outside 1..64.
func ParseSignal(p []byte) (syscall.Signal, bool) {
	if len(p) != 4 {
		return 0, false
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 || n > 64 {
		return 0, false
	}
	return syscall.Signal(n), true
}

// ResizePayload encodes a terminal size for a Resize frame: rows then
// columns, each a uint16 big-endian. It is the one size encoding of clade:
// the agent's wire uses it too.
func ResizePayload(rows, cols uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, rows)
	return binary.BigEndian.AppendUint16(b, cols)
}

// ParseResize decodes a Resize frame's payload. It returns false for a
// payload of another length or a zero dimension.
func ParseResize(p []byte) (rows, cols uint16, ok bool) {
	if len(p) != 4 {
		return 0, 0, false
	}
	rows, cols = binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	if rows == 0 || cols == 0 {
		return 0, 0, false
	}
	return rows, cols, true
}
