//go:build !linux

package deadpeer

import (
	"net"
	"time"
)

// watch is Linux's TCP_INFO watcher; elsewhere keepalive alone.
func watch(net.Conn, time.Duration) {}
