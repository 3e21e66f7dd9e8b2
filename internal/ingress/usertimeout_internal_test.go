package ingress

import (
	"math"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSendTimeoutExtremes: a --ingress-send-timeout below a millisecond
// or above what TCP_USER_TIMEOUT holds (a 32-bit count of milliseconds)
// still drops a client that stops reading: neither may leave the limit
// silently off (0 is the kernel's "none"; an overflowed value is refused).
func TestSendTimeoutExtremes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{500 * time.Microsecond, 1},
		{30 * time.Second, 30000},
		{1000 * time.Hour, math.MaxInt32},
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		setUserTimeout(c, tc.d)
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var got int
		var gerr error
		_ = rc.Control(func(fd uintptr) {
			got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		})
		c.Close()
		if gerr != nil || got != tc.want {
			t.Errorf("send timeout %s: TCP_USER_TIMEOUT %d (%v), want %d", tc.d, got, gerr, tc.want)
		}
	}
}
