//go:build !linux

package deadpeer

import (
	"syscall"
	"time"
)

// userTimeout is Linux's TCP_USER_TIMEOUT; elsewhere keepalive alone.
func userTimeout(time.Duration) func(network, address string, rc syscall.RawConn) error { return nil }
