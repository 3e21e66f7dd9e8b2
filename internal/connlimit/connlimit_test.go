package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// limited listens on loopback under lim and hands what Accept returns to
// the channel.
func limited(t *testing.T, lim Limits) (*Listener, <-chan net.Conn) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, lim)
	t.Cleanup(func() { l.Close() })
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			t.Cleanup(func() { c.Close() })
			ch <- c
		}
	}()
	return l, ch
}

// dialFrom connects to l from source address src (a 127.0.0.x).
func dialFrom(t *testing.T, l *Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// accepted waits for the server's side of the next admitted connection.
func accepted(t *testing.T, ch <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

// refused dials l from src and asserts the server closed the connection:
// the dial or a read ends at once with a reset (or EOF), not at the
// guard's deadline.
func refused(t *testing.T, l *Listener, src string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection from %s not refused: read %v", src, err)
		}
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("refused connection from %s: %v, want a reset or EOF", src, err)
	}
}

// TestCaps: the cap per address and the total cap each refuse one more
// connection at accept; a close gives its place back (once, however
// often it is closed).
func TestCaps(t *testing.T) {
	var refusals, perIP atomic.Int32
	l, ch := limited(t, Limits{Total: 3, PerIP: 2, Refused: func(_ net.Addr, ip bool) {
		refusals.Add(1)
		if ip {
			perIP.Add(1)
		}
	}})
	dialFrom(t, l, "127.0.0.2")
	a1 := accepted(t, ch)
	dialFrom(t, l, "127.0.0.2")
	accepted(t, ch)
	refused(t, l, "127.0.0.2") // the third from .2
	if got := l.Open(); got != 2 {
		t.Fatalf("open %d, want 2", got)
	}
	dialFrom(t, l, "127.0.0.3")
	accepted(t, ch)
	refused(t, l, "127.0.0.3") // the fourth in all
	refused(t, l, "127.0.0.4")
	if got, ip := refusals.Load(), perIP.Load(); got != 3 || ip != 1 || l.Refused() != 3 {
		t.Fatalf("refusals %d (%d per address, %d counted), want 3 (1)", got, ip, l.Refused())
	}

	// Closed twice, it gives one place back: .2 may open one again, and
	// the total is full again after it.
	a1.Close()
	a1.Close()
	if got := l.Open(); got != 2 {
		t.Fatalf("open %d after a close, want 2", got)
	}
	dialFrom(t, l, "127.0.0.2")
	accepted(t, ch)
	refused(t, l, "127.0.0.4")
	if got := l.Open(); got != 3 {
		t.Fatalf("open %d, want 3", got)
	}
}

// TestNoCaps: zero limits admit everything.
func TestNoCaps(t *testing.T) {
	l, ch := limited(t, Limits{})
	for range 20 {
		dialFrom(t, l, "127.0.0.2")
		accepted(t, ch)
	}
	if got := l.Open(); got != 20 {
		t.Fatalf("open %d, want 20", got)
	}
}

// TestTCPConn: an admitted TCP connection keeps what servers use of a
// *net.TCPConn (sendfile/splice, half-close, socket options) and unwraps
// to it.
func TestTCPConn(t *testing.T) {
	l, ch := limited(t, Limits{Total: 1})
	dialFrom(t, l, "127.0.0.1")
	c := accepted(t, ch)
	if _, ok := c.(io.ReaderFrom); !ok {
		t.Error("no ReadFrom")
	}
	if _, ok := c.(io.WriterTo); !ok {
		t.Error("no WriteTo")
	}
	if _, ok := c.(interface{ CloseWrite() error }); !ok {
		t.Error("no CloseWrite")
	}
	if _, ok := c.(syscall.Conn); !ok {
		t.Error("no SyscallConn")
	}
	if _, ok := Unwrap(c).(*net.TCPConn); !ok {
		t.Errorf("Unwrap gives %T", Unwrap(c))
	}
}

func TestClientKey(t *testing.T) {
	for _, tc := range []struct {
		addr  net.Addr
		key   string
		keyed bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 1}, "127.0.0.2/32", true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 1}, "10.0.0.1/32", true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 1}, "2001:db8:1:2::/64", true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::ffff"), Port: 9, Zone: "eth0"}, "2001:db8:1:2::/64", true},
		{&net.TCPAddr{}, "", false},
		{&net.UnixAddr{Name: "@", Net: "unix"}, "", false},
	} {
		key, keyed := clientKey(tc.addr)
		if keyed != tc.keyed || keyed && key != netip.MustParsePrefix(tc.key) {
			t.Errorf("%v: key %v %v, want %s %v", tc.addr, key, keyed, tc.key, tc.keyed)
		}
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		fds           uint64
		div, ceil, to int
	}{
		{20000, 4, 4096, 4096},
		{1024, 4, 4096, 256},
		{2, 4, 4096, 1},
		{1 << 62, 8, 4096, 4096},
	} {
		if got := Share(tc.fds, tc.div, tc.ceil); got != tc.to {
			t.Errorf("Share(%d, %d, %d) = %d, want %d", tc.fds, tc.div, tc.ceil, got, tc.to)
		}
	}
}
