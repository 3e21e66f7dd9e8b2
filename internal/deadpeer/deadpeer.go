// Package deadpeer makes TCP connections that give up on a peer that has
// gone silent (a cut link, a host that vanished) within a set time, where
// the kernel alone keeps retransmitting for about 15 minutes and a call on
// the connection hangs as long. A peer that is only slow is not cut off:
// its kernel still acknowledges what it receives and answers keepalive
// probes.
package deadpeer

import (
	"net"
	"time"
)

// Default is the time clients and the daemon's TCP listener give a silent
// peer: long enough for any peer that is only loaded (its kernel answers),
// short enough that a call on a cut link fails within a user's patience.
const Default = 30 * time.Second

// keepAlive probes an idle connection after a third of d, then every
// sixth: three unanswered probes end it within d.
func keepAlive(d time.Duration) net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: d / 3, Interval: d / 6, Count: 3}
}

// Dialer returns a dialer whose connect gives up after connect and whose
// TCP connections close once the peer has left data unacknowledged, or
// keepalive probes unanswered, for about d (TCP_USER_TIMEOUT on Linux;
// keepalive alone elsewhere). d <= 0 leaves the kernel's defaults.
func Dialer(connect, d time.Duration) *net.Dialer {
	nd := &net.Dialer{Timeout: connect}
	if d > 0 {
		nd.KeepAliveConfig = keepAlive(d)
		nd.Control = userTimeout(d)
	}
	return nd
}

// ListenConfig is Dialer's rule for the connections a listener accepts
// (they inherit the listening socket's TCP_USER_TIMEOUT).
func ListenConfig(d time.Duration) *net.ListenConfig {
	lc := &net.ListenConfig{}
	if d > 0 {
		lc.KeepAliveConfig = keepAlive(d)
		lc.Control = userTimeout(d)
	}
	return lc
}
