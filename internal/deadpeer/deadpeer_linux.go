package deadpeer

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// watch closes c once its peer has acknowledged nothing for d while c
// waits on it: data sent and unacknowledged (retransmitted in vain), or
// two zero-window probes in a row unanswered. A peer whose window stays
// closed but answers each probe is kept, however long. Idle connections
// are keepalive's. The watcher ends with the connection.
func watch(c net.Conn, d time.Duration) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	go func() {
		t := time.NewTicker(pollEvery(d))
		defer t.Stop()
		for range t.C {
			var info *unix.TCPInfo
			var gerr error
			if err := rc.Control(func(fd uintptr) {
				info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			}); err != nil || gerr != nil {
				return // closed
			}
			if dead(info, d) {
				_ = c.Close()
				return
			}
		}
	}()
}

func dead(i *unix.TCPInfo, d time.Duration) bool {
	silent := time.Duration(i.Last_ack_recv) * time.Millisecond
	return silent >= d && (i.Unacked > 0 || i.Probes >= 2)
}
