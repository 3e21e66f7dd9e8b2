package deadpeer

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// userTimeout sets TCP_USER_TIMEOUT: the kernel closes the connection when
// data it sent (keepalive probes included) stays unacknowledged for d.
func userTimeout(d time.Duration) func(network, address string, rc syscall.RawConn) error {
	return func(network, _ string, rc syscall.RawConn) error {
		if network != "tcp" && network != "tcp4" && network != "tcp6" {
			return nil
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		}); err != nil {
			return err
		}
		return serr
	}
}
