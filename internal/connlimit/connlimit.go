// Package connlimit caps the connections a listener holds open, in all and
// per client address, so that a client that opens connections without end
// (and sends nothing, or nothing the server takes) cannot take the
// process's file descriptors: a connection over a cap is closed as it is
// accepted, with a reset, and never reaches the server.
//
// A connection's place is given back when it is closed, however it ends:
// by the server, by a handler that took it over (a WebSocket), or at
// shutdown.
package connlimit

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Limits are a listener's caps.
type Limits struct {
	// Total bounds the connections open at once; <= 0: no bound.
	Total int
	// PerIP bounds those from one client address, an IPv6 one by its /64
	// (a host commonly holds a whole /64); <= 0: no bound. A connection
	// from no IP address (a unix socket's) counts only in Total.
	PerIP int
	// Refused, if set, is called on the accepting goroutine for each
	// connection closed at accept, with its client address and whether
	// the PerIP cap (else the Total one) refused it. It must not block.
	Refused func(remote net.Addr, perIP bool)
}

// FDLimit returns the process's soft limit of open files (RLIMIT_NOFILE;
// the Go runtime raises it to the hard limit at start), or 1024 when it
// cannot be read.
func FDLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 1024
	}
	return r.Cur
}

// Share returns min(ceiling, fds/div), at least 1: a listener's cap that
// keeps its connections within a share of a descriptor limit of fds.
func Share(fds uint64, div, ceiling int) int {
	return int(max(1, min(uint64(ceiling), fds/uint64(div))))
}

// Listener is a net.Listener under Limits. Its Accept returns only
// connections within the caps.
type Listener struct {
	net.Listener
	lim     Limits
	refused atomic.Uint64

	mu   sync.Mutex
	open int                  // guarded by mu
	byIP map[netip.Prefix]int // guarded by mu: open connections by client address
}

// New returns ln under lim.
func New(ln net.Listener, lim Limits) *Listener {
	return &Listener{Listener: ln, lim: lim, byIP: map[netip.Prefix]int{}}
}

// Accept waits for the next connection within the caps, closing those
// over them as they come. Its errors are the inner listener's.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, keyed := clientKey(c.RemoteAddr())
		if ok, perIP := l.admit(key, keyed); !ok {
			l.refused.Add(1)
			if l.lim.Refused != nil {
				l.lim.Refused(c.RemoteAddr(), perIP)
			}
			refuse(c)
			continue
		}
		return wrap(c, func() { l.release(key, keyed) }), nil
	}
}

// admit takes a place for a connection from key, unless a cap is full:
// then ok is false and perIP says which.
func (l *Listener) admit(key netip.Prefix, keyed bool) (ok, perIP bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.Total > 0 && l.open >= l.lim.Total {
		return false, false
	}
	if keyed && l.lim.PerIP > 0 && l.byIP[key] >= l.lim.PerIP {
		return false, true
	}
	l.open++
	if keyed {
		l.byIP[key]++
	}
	return true, false
}

func (l *Listener) release(key netip.Prefix, keyed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if keyed {
		if l.byIP[key]--; l.byIP[key] <= 0 {
			delete(l.byIP, key)
		}
	}
}

// Open returns the number of accepted connections not yet closed.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused returns the number of connections closed at accept so far.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// clientKey is the address a's connections are counted under: an IPv4
// address, or an IPv6 one's /64. keyed is false for a non-IP address.
func clientKey(a net.Addr) (key netip.Prefix, keyed bool) {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, keyed = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, keyed = netip.AddrFromSlice(a.IP)
	}
	if !keyed {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	key, err := ip.Prefix(bits)
	return key, err == nil
}

// refuse closes a connection over a cap at once, with a reset: no
// TIME_WAIT, nothing left to flush.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// wrap returns c whose Close also calls release (once). A TCP connection
// keeps what servers look for on one: ReadFrom and WriteTo (net/http's
// sendfile and splice), CloseWrite (its half-close before a close) and
// SyscallConn (socket options).
func wrap(c net.Conn, release func()) net.Conn {
	if tc, ok := c.(*net.TCPConn); ok {
		return &tcpConn{conn: conn{Conn: c, release: release}, tc: tc}
	}
	return &conn{Conn: c, release: release}
}

type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the connection and gives its place back; it is safe to
// call more than once.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// NetConn returns the connection under c (as tls.Conn's does).
func (c *conn) NetConn() net.Conn { return c.Conn }

type tcpConn struct {
	conn
	tc *net.TCPConn
}

func (c *tcpConn) ReadFrom(r io.Reader) (int64, error)   { return c.tc.ReadFrom(r) }
func (c *tcpConn) WriteTo(w io.Writer) (int64, error)    { return c.tc.WriteTo(w) }
func (c *tcpConn) CloseWrite() error                     { return c.tc.CloseWrite() }
func (c *tcpConn) SyscallConn() (syscall.RawConn, error) { return c.tc.SyscallConn() }

// Unwrap returns the connection under any number of wrappers that say
// theirs with NetConn (this package's, tls.Conn).
func Unwrap(c net.Conn) net.Conn {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return c
		}
		c = u.NetConn()
	}
}
