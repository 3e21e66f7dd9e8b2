// Package deadpeer makes TCP connections that give up on a peer that has
// gone silent (a cut link, a host that vanished) within a set time, where
// the kernel alone keeps retransmitting for about 15 minutes and a call on
// the connection hangs as long. A peer that is only slow is not cut off:
// its kernel still acknowledges what it receives and answers keepalive and
// zero-window probes, however long it leaves its receive window closed (a
// reader that stopped reading: an exec's output piped to a paused pager, a
// websocket client that is busy, an upload to a daemon whose disk is slow).
//
// TCP_USER_TIMEOUT is not the rule: Linux also closes a connection whose
// peer kept its window closed for that long, its probes answered or not
// (tcp_probe_timer), so a paused reader would lose its stream. A watcher
// looks at each connection's TCP_INFO instead.
package deadpeer

import (
	"context"
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

// A Dialer's TCP connections close once the peer has left data
// unacknowledged, or probes unanswered, for about its dead-peer time.
type Dialer struct {
	nd *net.Dialer
	d  time.Duration
}

// NewDialer returns a dialer whose connect gives up after connect and
// whose TCP connections close once the peer has left data
// unacknowledged, or keepalive or zero-window probes unanswered, for about
// d (a watcher on TCP_INFO on Linux; keepalive alone elsewhere). d <= 0
// leaves the kernel's defaults.
func NewDialer(connect, d time.Duration) *Dialer {
	nd := &net.Dialer{Timeout: connect}
	if d > 0 {
		nd.KeepAliveConfig = keepAlive(d)
	}
	return &Dialer{nd: nd, d: d}
}

// DialContext is net.Dialer's, the connection watched.
func (x *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := x.nd.DialContext(ctx, network, address)
	if err == nil && x.d > 0 {
		watch(c, x.d)
	}
	return c, err
}

// Dial is DialContext without a context.
func (x *Dialer) Dial(network, address string) (net.Conn, error) {
	return x.DialContext(context.Background(), network, address)
}

// ListenConfig is Dialer's rule for the connections a listener accepts.
type ListenConfig struct {
	lc *net.ListenConfig
	d  time.Duration
}

// NewListenConfig returns NewDialer's rule for accepted connections.
func NewListenConfig(d time.Duration) *ListenConfig {
	lc := &net.ListenConfig{}
	if d > 0 {
		lc.KeepAliveConfig = keepAlive(d)
	}
	return &ListenConfig{lc: lc, d: d}
}

// Listen is net.ListenConfig's, each accepted connection watched.
func (x *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	ln, err := x.lc.Listen(ctx, network, address)
	if err != nil || x.d <= 0 {
		return ln, err
	}
	return &listener{Listener: ln, d: x.d}, nil
}

type listener struct {
	net.Listener
	d time.Duration
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		watch(c, l.d)
	}
	return c, err
}

// pollEvery is how often a watcher looks at its connection for a
// dead-peer time of d.
func pollEvery(d time.Duration) time.Duration {
	return min(max(d/10, 50*time.Millisecond), time.Second)
}
