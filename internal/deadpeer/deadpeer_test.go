package deadpeer_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/deadpeer"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestCutLinkFails: a connection to a test host whose link is then cut
// fails within the dead-peer time, both with a request in flight (data
// left unacknowledged) and idle (keepalive probes unanswered), where a
// plain connection still waits when the test's read deadline ends it.
func TestCutLinkFails(t *testing.T) {
	h := testenv.StartTestHost(t, testenv.ReserveNet(t))
	link, err := netlink.LinkByName(filepath.Base(h.NS))
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(h.Addr.String(), "80")
	const dead = 2 * time.Second
	dial := func(d interface {
		Dial(network, address string) (net.Conn, error)
	}) net.Conn {
		t.Helper()
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	plain := dial(&net.Dialer{Timeout: 5 * time.Second})
	sending := dial(deadpeer.NewDialer(5*time.Second, dead))
	idle := dial(deadpeer.NewDialer(5*time.Second, dead))
	// The host answers before the cut.
	if _, err := sending.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := sending.Read(buf); err != nil || n == 0 {
		t.Fatalf("the test host before the cut: %d %v", n, err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkSetUp(link)
	req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, c := range []net.Conn{plain, sending} {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 12 * time.Second
	read := func(name string, c net.Conn) (time.Duration, error) {
		start := time.Now()
		_ = c.SetReadDeadline(start.Add(limit))
		_, err := c.Read(buf)
		t.Logf("%s: read after %s: %v", name, time.Since(start).Round(10*time.Millisecond), err)
		return time.Since(start), err
	}
	for name, c := range map[string]net.Conn{"in flight": sending, "idle": idle} {
		if _, err := read(name, c); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s on a cut link with a dead-peer time of %s: %v, want the connection closed before %s", name, dead, err, limit)
		}
	}
	if _, err := read("plain", plain); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a plain connection on a cut link: %v, want it still waiting at the deadline (else this test shows nothing)", err)
	}
}

// TestListenerKeepAlive: a connection a deadpeer listener accepts is a
// *net.TCPConn (what http.Server expects) with the listener's keepalive.
func TestListenerKeepAlive(t *testing.T) {
	ln, err := deadpeer.NewListenConfig(3*time.Second).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("accepted %T, want *net.TCPConn", c)
	}
	if got := sockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE); got != 1 {
		t.Errorf("accepted connection's TCP_KEEPIDLE = %d s, want 1", got)
	}
	if got := sockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT); got != 0 {
		t.Errorf("accepted connection's TCP_USER_TIMEOUT = %d ms, want 0 (it would cut a paused reader)", got)
	}
}

func sockopt(t *testing.T, c *net.TCPConn, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}
