package wire

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte{0xa5}, MaxPayload)
	tests := []struct {
		name    string
		typ     Type
		ch      uint32
		payload []byte
	}{
		{name: "empty payload", typ: Stdout, ch: 1},
		{name: "stdin", typ: Stdin, ch: 7, payload: []byte("hello\n")},
		{name: "exit json", typ: Exit, ch: 3, payload: []byte(`{"code":0}`)},
		{name: "max channel", typ: Stderr, ch: math.MaxUint32, payload: []byte{0}},
		{name: "max payload", typ: Stdout, ch: 2, payload: big},
		{name: "first type", typ: Hello, ch: 0, payload: []byte(`{"version":1}`)},
		{name: "last type", typ: typeEnd - 1, ch: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := AppendFrame(nil, tt.typ, tt.ch, tt.payload)
			if len(b) != HeaderSize+len(tt.payload) {
				t.Fatalf("encoded %d bytes, want %d", len(b), HeaderSize+len(tt.payload))
			}
			r := NewReader(bytes.NewReader(b))
			f, err := r.Read()
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if f.Type != tt.typ || f.Channel != tt.ch || !bytes.Equal(f.Payload, tt.payload) {
				t.Fatalf("Read = {%v %d %d bytes}, want {%v %d %d bytes}", f.Type, f.Channel, len(f.Payload), tt.typ, tt.ch, len(tt.payload))
			}
			if _, err := r.Read(); err != io.EOF {
				t.Fatalf("Read after the last frame: %v, want io.EOF", err)
			}
		})
	}

	t.Run("sequence", func(t *testing.T) {
		var b []byte
		for _, tt := range tests {
			b = AppendFrame(b, tt.typ, tt.ch, tt.payload)
		}
		r := NewReader(bytes.NewReader(b))
		for _, tt := range tests {
			f, err := r.Read()
			if err != nil {
				t.Fatalf("Read %s: %v", tt.name, err)
			}
			if f.Type != tt.typ || f.Channel != tt.ch || !bytes.Equal(f.Payload, tt.payload) {
				t.Fatalf("Read %s = {%v %d %d bytes}", tt.name, f.Type, f.Channel, len(f.Payload))
			}
		}
		if _, err := r.Read(); err != io.EOF {
			t.Fatalf("Read at the clean end between frames: %v, want io.EOF", err)
		}
	})
}

func TestParseHeader(t *testing.T) {
	hdr := func(typ byte, ch, n uint32) []byte {
		return AppendHeader(nil, Type(typ), ch, int(n))
	}
	tests := []struct {
		name    string
		h       []byte
		wantErr bool
		wantN   uint32
	}{
		{name: "valid", h: hdr(byte(Exit), 5, 10), wantN: 10},
		{name: "max payload", h: hdr(byte(Stdout), 0, MaxPayload), wantN: MaxPayload},
		{name: "last type", h: hdr(byte(typeEnd-1), 0, 0)},
		{name: "short", h: hdr(byte(Stdout), 0, 0)[:HeaderSize-1], wantErr: true},
		{name: "empty", h: nil, wantErr: true},
		{name: "type 0", h: hdr(0, 0, 0), wantErr: true},
		{name: "type end", h: hdr(byte(typeEnd), 0, 0), wantErr: true},
		{name: "type 255", h: hdr(255, 0, 0), wantErr: true},
		{name: "oversize", h: hdr(byte(Stdout), 0, MaxPayload+1), wantErr: true},
		{name: "max uint32 length", h: hdr(byte(Stdout), 0, math.MaxUint32), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, n, err := ParseHeader(tt.h)
			if tt.wantErr {
				if !errors.Is(err, ErrFrame) {
					t.Fatalf("ParseHeader(%x) = %v, want ErrFrame", tt.h, err)
				}
				if len(tt.h) == HeaderSize {
					// The Reader must refuse it the same way, before reading
					// (or allocating for) any payload.
					r := NewReader(bytes.NewReader(tt.h))
					if _, err := r.Read(); !errors.Is(err, ErrFrame) {
						t.Fatalf("Reader.Read(%x) = %v, want ErrFrame", tt.h, err)
					}
					if len(r.buf) > readerMin {
						t.Fatalf("Reader allocated %d bytes for a refused header", len(r.buf))
					}
				}
				return
			}
			if err != nil || n != tt.wantN {
				t.Fatalf("ParseHeader(%x) = %d, %v, want %d, nil", tt.h, n, err, tt.wantN)
			}
		})
	}
}

func TestReaderTruncated(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
	}{
		{name: "with payload", frame: AppendFrame(nil, Stdout, 9, []byte("some output"))},
		{name: "empty payload", frame: AppendFrame(nil, Close, 9, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev := AppendFrame(nil, Ping, 0, []byte("p"))
			for cut := 1; cut < len(tt.frame); cut++ {
				r := NewReader(bytes.NewReader(append(prev[:len(prev):len(prev)], tt.frame[:cut]...)))
				if _, err := r.Read(); err != nil {
					t.Fatalf("cut %d: first frame: %v", cut, err)
				}
				if _, err := r.Read(); err != io.ErrUnexpectedEOF {
					t.Fatalf("frame cut after %d of %d bytes: %v, want io.ErrUnexpectedEOF", cut, len(tt.frame), err)
				}
			}
		})
	}
	t.Run("empty stream", func(t *testing.T) {
		if _, err := NewReader(bytes.NewReader(nil)).Read(); err != io.EOF {
			t.Fatalf("Read on an empty stream: %v, want io.EOF", err)
		}
	})
}

func TestWindowPayload(t *testing.T) {
	for _, n := range []uint32{0, 1, InitialWindow, math.MaxUint32} {
		st, got, err := ParseWindow(WindowPayload(Stdin, n))
		if err != nil || st != Stdin || got != n {
			t.Errorf("ParseWindow(WindowPayload(stdin, %d)) = %v, %d, %v", n, st, got, err)
		}
	}
	for _, p := range [][]byte{nil, {1, 2, 3, 4}, {1, 2, 3, 4, 5, 6}} {
		if _, _, err := ParseWindow(p); !errors.Is(err, ErrFrame) {
			t.Errorf("ParseWindow(%x) = %v, want ErrFrame", p, err)
		}
	}
}

// pipe returns a Conn writing to one end of a net.Pipe and a Reader on the
// other end.
func pipe(t *testing.T) (*Conn, *Reader) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	// A flow-control bug shows as a stuck pipe: fail instead of hanging.
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	return NewConn(a), NewReader(b)
}

func TestConnRefusesOversizePayload(t *testing.T) {
	c, _ := pipe(t)
	if err := c.Write(Stdout, 1, make([]byte, MaxPayload+1)); err == nil {
		t.Fatal("Conn.Write of a payload over MaxPayload succeeded")
	}
}

// TestSenderWindow checks that a Sender never has more than its credit in
// flight: the receiving side counts what arrives and grants credit only
// when the whole window is used up.
func TestSenderWindow(t *testing.T) {
	c, r := pipe(t)
	s := NewSender(c, 4, Stdout)
	data := make([]byte, 3*InitialWindow+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		if err == nil {
			err = s.Close()
		}
		werr <- err
	}()

	var got []byte
	var outstanding, peak int
	for {
		f, err := r.Read()
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		if f.Type != Stdout || f.Channel != 4 {
			t.Fatalf("got a %v frame on channel %d, want stdout on 4", f.Type, f.Channel)
		}
		if len(f.Payload) == 0 {
			break
		}
		if len(f.Payload) > ChunkSize {
			t.Fatalf("data frame of %d bytes, over ChunkSize %d", len(f.Payload), ChunkSize)
		}
		got = append(got, f.Payload...)
		outstanding += len(f.Payload)
		peak = max(peak, outstanding)
		if outstanding > InitialWindow {
			t.Fatalf("sender has %d bytes unacknowledged, over the window of %d", outstanding, InitialWindow)
		}
		if outstanding == InitialWindow {
			// Grant in uneven steps so credit and chunks do not line up.
			grant := InitialWindow/3 + 1
			outstanding -= grant
			s.Grant(uint32(grant))
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("Write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("received %d bytes that differ from the %d sent", len(got), len(data))
	}
	if peak != InitialWindow {
		t.Errorf("peak in flight %d, want the whole window %d", peak, InitialWindow)
	}
}

// TestSenderBlocks checks that a Sender out of credit waits for a grant and
// that Abort wakes it.
func TestSenderBlocks(t *testing.T) {
	c, r := pipe(t)
	go func() {
		for {
			if _, err := r.Read(); err != nil {
				return
			}
		}
	}()
	s := NewSender(c, 1, Stdin)
	if n, err := s.Write(make([]byte, InitialWindow)); n != InitialWindow || err != nil {
		t.Fatalf("Write of the whole window = %d, %v", n, err)
	}
	done := make(chan struct{})
	var n int
	var err error
	go func() {
		n, err = s.Write([]byte("x"))
		close(done)
	}()
	select {
	case <-done:
		t.Fatalf("Write without credit returned %d, %v; want it to block", n, err)
	case <-time.After(50 * time.Millisecond):
	}
	boom := errors.New("boom")
	s.Abort(boom)
	<-done
	if n != 0 || err != boom {
		t.Fatalf("Write after Abort = %d, %v, want 0, boom", n, err)
	}
}

// TestReceiverWindow checks that Push refuses data beyond the window and
// that reading frees room for exactly what was read.
func TestReceiverWindow(t *testing.T) {
	c, acks := pipe(t)
	var mu sync.Mutex
	var acked uint32
	go func() {
		for {
			f, err := acks.Read()
			if err != nil {
				return
			}
			if st, n, err := ParseWindow(f.Payload); f.Type == Window && err == nil && st == Stdout {
				mu.Lock()
				acked += n
				mu.Unlock()
			}
		}
	}()
	rc := NewReceiver(c, 2, Stdout)
	chunk := make([]byte, ChunkSize)
	for i := 0; i < InitialWindow/ChunkSize; i++ {
		if err := rc.Push(chunk); err != nil {
			t.Fatalf("Push %d within the window: %v", i, err)
		}
	}
	if err := rc.Push([]byte{1}); !errors.Is(err, ErrWindow) {
		t.Fatalf("Push beyond the window = %v, want ErrWindow", err)
	}
	buf := make([]byte, 100)
	if n, err := rc.Read(buf); n != len(buf) || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if err := rc.Push(make([]byte, len(buf)+1)); !errors.Is(err, ErrWindow) {
		t.Fatalf("Push of one byte more than was read = %v, want ErrWindow", err)
	}
	if err := rc.Push(make([]byte, len(buf))); err != nil {
		t.Fatalf("Push of what was read: %v", err)
	}

	// Draining everything acknowledges all but less than ackEvery of what
	// was read: never so little that the sender stays blocked.
	if err := rc.Push(nil); err != nil {
		t.Fatalf("Push EOF: %v", err)
	}
	total := len(buf)
	for {
		n, err := rc.Read(chunk)
		total += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	if total != InitialWindow+len(buf) {
		t.Fatalf("read %d bytes, want %d", total, InitialWindow+len(buf))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		a := acked
		mu.Unlock()
		if a >= InitialWindow && uint32(total)-a < ackEvery {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged %d of %d bytes read, want all but less than %d", a, total, ackEvery)
		}
		time.Sleep(time.Millisecond)
	}
	if err := rc.Push([]byte("late")); err != nil {
		t.Fatalf("Push after EOF = %v, want the data dropped", err)
	}
}

// TestSenderReceiver runs a Sender against a Receiver whose acks come back as
// Window frames, with a slow consumer: the Receiver must never see the
// Sender overrun its window, and the data must arrive intact.
func TestSenderReceiver(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	ca, cb := NewConn(a), NewConn(b)
	s := NewSender(ca, 1, Stdout)
	rc := NewReceiver(cb, 1, Stdout)

	// a reads Window frames and grants; b reads data frames and pushes.
	go func() {
		r := NewReader(a)
		for {
			f, err := r.Read()
			if err != nil {
				return
			}
			if st, n, err := ParseWindow(f.Payload); f.Type == Window && err == nil && st == Stdout {
				s.Grant(n)
			}
		}
	}()
	pushErr := make(chan error, 1)
	go func() {
		r := NewReader(b)
		for {
			f, err := r.Read()
			if err != nil {
				pushErr <- nil
				return
			}
			if err := rc.Push(f.Payload); err != nil {
				pushErr <- err
				rc.CloseWithError(err)
				return
			}
		}
	}()

	data := make([]byte, 4*InitialWindow+999)
	for i := range data {
		data[i] = byte(i * 13)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		if err == nil {
			err = s.Close()
		}
		werr <- err
	}()
	var got bytes.Buffer
	buf := make([]byte, 1000) // small reads: a slow consumer
	for {
		n, err := rc.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("Write: %v", err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("received %d bytes that differ from the %d sent", got.Len(), len(data))
	}
	a.Close()
	b.Close()
	if err := <-pushErr; err != nil {
		t.Fatalf("Push: %v", err)
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte{})
	f.Add(AppendFrame(nil, Stdout, 1, []byte("hi")))
	f.Add(AppendFrame(AppendFrame(nil, Started, 2, []byte(`{"pid":1}`)), Exit, 2, []byte(`{"code":0}`)))
	f.Add(AppendFrame(nil, Stdin, 0, nil)[:5])
	f.Add(AppendHeader(nil, Stdout, 0, 10))
	f.Add(AppendHeader(nil, Stdout, 0, MaxPayload+1))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{byte(typeEnd), 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		off := 0
		for {
			fr, err := r.Read()
			if cap(r.buf) > MaxPayload {
				t.Fatalf("Reader buffer grew to %d bytes, over MaxPayload", cap(r.buf))
			}
			if err != nil {
				rest := len(data) - off
				switch {
				case err == io.EOF:
					if rest != 0 {
						t.Fatalf("io.EOF with %d bytes unread", rest)
					}
				case err == io.ErrUnexpectedEOF:
					if rest == 0 {
						t.Fatal("io.ErrUnexpectedEOF at a frame boundary")
					}
				case errors.Is(err, ErrFrame):
					if _, _, perr := ParseHeader(data[off:]); perr == nil {
						t.Fatalf("ErrFrame for a header ParseHeader accepts: %v", err)
					}
				default:
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("frame with %d-byte payload", len(fr.Payload))
			}
			n := HeaderSize + len(fr.Payload)
			if off+n > len(data) {
				t.Fatalf("frame of %d bytes at offset %d overruns %d bytes of input", n, off, len(data))
			}
			if enc := AppendFrame(nil, fr.Type, fr.Channel, fr.Payload); !bytes.Equal(enc, data[off:off+n]) {
				t.Fatalf("frame at offset %d re-encodes to %x, read from %x", off, enc, data[off:off+n])
			}
			off += n
		}
	})
}

// countingReader counts the reads made of it.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) { c.reads++; return c.r.Read(p) }

// TestReaderBurst: frames that arrive together are cut out of one read,
// big and small alike, intact and in order.
func TestReaderBurst(t *testing.T) {
	big := bytes.Repeat([]byte{0x5a}, ChunkSize)
	var stream []byte
	var want [][]byte
	for i := range 8 {
		p := big
		if i%2 == 1 {
			p = []byte{byte(i)}
		}
		stream = AppendFrame(stream, Stdin, uint32(i+1), p)
		want = append(want, p)
	}
	cr := &countingReader{r: bytes.NewReader(stream)}
	r := NewReader(cr)
	for i, p := range want {
		f, err := r.Read()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Channel != uint32(i+1) || !bytes.Equal(f.Payload, p) {
			t.Fatalf("frame %d: channel %d, %d bytes; want channel %d, %d bytes", i, f.Channel, len(f.Payload), i+1, len(p))
		}
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
	// 4 big frames (1 MiB) and 4 small ones: a few reads, not one or more
	// per frame.
	if cr.reads >= len(want) {
		t.Fatalf("%d reads for %d frames, want fewer", cr.reads, len(want))
	}
}

// TestReceiverWriteTo: WriteTo hands over every payload in order,
// acknowledges what it wrote, and ends with the stream's error.
func TestReceiverWriteTo(t *testing.T) {
	c, acks := pipe(t)
	var acked atomicU32
	go func() {
		for {
			f, err := acks.Read()
			if err != nil {
				return
			}
			if st, n, err := ParseWindow(f.Payload); f.Type == Window && err == nil && st == Stdin {
				acked.add(n)
			}
		}
	}()
	rc := NewReceiver(c, 3, Stdin)
	var want bytes.Buffer
	for i := range 6 {
		p := bytes.Repeat([]byte{byte(i)}, []int{ChunkSize, 7, ChunkSize / 2, ChunkSize, 1, 100}[i])
		want.Write(p)
		if err := rc.Push(p); err != nil {
			t.Fatal(err)
		}
	}
	_ = rc.Push(nil)
	var got bytes.Buffer
	n, err := rc.WriteTo(&got)
	if err != nil || n != int64(want.Len()) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("WriteTo = %d, %v (%d bytes match: %v), want %d, nil", n, err, got.Len(), bytes.Equal(got.Bytes(), want.Bytes()), want.Len())
	}
	deadline := time.Now().Add(5 * time.Second)
	for acked.load() < ackEvery {
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged %d of %d bytes written, want at least %d", acked.load(), n, ackEvery)
		}
		time.Sleep(time.Millisecond)
	}

	rc = NewReceiver(c, 4, Stdin)
	_ = rc.Push([]byte("partial"))
	boom := errors.New("connection lost")
	rc.CloseWithError(boom)
	got.Reset()
	// What was queued is written, then the error ends it.
	if _, err := rc.WriteTo(&got); !errors.Is(err, boom) || got.String() != "partial" {
		t.Fatalf("WriteTo after CloseWithError = %q, %v; want \"partial\", %v", got.String(), err, boom)
	}
}

type atomicU32 struct {
	mu sync.Mutex
	v  uint32
}

func (a *atomicU32) add(n uint32) { a.mu.Lock(); a.v += n; a.mu.Unlock() }
func (a *atomicU32) load() uint32 { a.mu.Lock(); defer a.mu.Unlock(); return a.v }

// TestReceiverWiden: a widened receiver tells the sender the extra credit
// in one Window frame and takes that much more before ErrWindow.
func TestReceiverWiden(t *testing.T) {
	c, peer := pipe(t)
	got := make(chan Frame, 1)
	go func() {
		f, err := peer.Read()
		if err == nil {
			f.Payload = append([]byte(nil), f.Payload...)
			got <- f
		}
	}()
	rc := NewReceiver(c, 5, Stdin)
	if err := rc.Widen(BulkWindow); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-got:
		st, n, err := ParseWindow(f.Payload)
		if f.Type != Window || f.Channel != 5 || err != nil || st != Stdin || n != BulkWindow-InitialWindow {
			t.Fatalf("Widen sent %v on %d: %v %d %v, want a Window of %d on stdin", f.Type, f.Channel, st, n, err, BulkWindow-InitialWindow)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Widen sent no Window frame")
	}
	chunk := make([]byte, ChunkSize)
	for i := 0; i < BulkWindow/ChunkSize; i++ {
		if err := rc.Push(chunk); err != nil {
			t.Fatalf("Push %d within the widened window: %v", i, err)
		}
	}
	if err := rc.Push([]byte{1}); !errors.Is(err, ErrWindow) {
		t.Fatalf("Push beyond the widened window = %v, want ErrWindow", err)
	}
}
