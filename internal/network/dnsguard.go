package network

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds on what the sandboxes' lookups may take of the daemon. A query
// the forwarder sends upstream holds one socket (two if the answer is
// retried over TCP) until it is answered or times out, so the in-flight
// caps bound the daemon's files: at most maxInflight plus two listeners
// and maxSlotConns TCP connections per slot, and maxConns of those in all.
const (
	// maxSlotInflight is how many of one slot's queries may wait on the
	// upstream at a time; one more is answered SERVFAIL at once.
	maxSlotInflight = 32
	// maxInflight is the same for all slots together: 32 flooding
	// sandboxes take it all, so it is far above what one can take.
	maxInflight = 1024
	// slotRate and slotBurst are a slot's token bucket: queries a second,
	// and how many may come at once. A query over it is dropped unanswered,
	// the cheapest thing to do with a flood.
	slotRate  = 200
	slotBurst = 400
	// maxSlotConns is how many TCP connections one slot may hold to its
	// resolver, maxConns all slots together; one more is closed at once.
	maxSlotConns = 16
	maxConns     = 512
	// upstreamTimeout is how long one upstream has to answer.
	upstreamTimeout = 2 * time.Second
	// tcpIdleTimeout is how long a sandbox's TCP connection to the
	// resolver stays open without a query (the first has tcpReadTimeout).
	tcpReadTimeout = 2 * time.Second
	tcpIdleTimeout = 5 * time.Second
)

// guard counts what a slot's, or all slots', lookups hold.
type guard struct {
	inflight atomic.Int32
	conns    atomic.Int32

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newGuard() *guard { return &guard{tokens: slotBurst} }

// take adds one to c if that leaves it at most limit.
func take(c *atomic.Int32, limit int32) bool {
	if c.Add(1) > limit {
		c.Add(-1)
		return false
	}
	return true
}

// allow reports whether the slot's bucket holds a token for one more
// query at now, and takes it.
func (g *guard) allow(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() {
		g.tokens = min(slotBurst, g.tokens+now.Sub(g.last).Seconds()*slotRate)
	}
	g.last = now
	if g.tokens < 1 {
		return false
	}
	g.tokens--
	return true
}

// acquire takes an in-flight place for one query of slot g; release gives
// it back. False when the slot or the forwarder is at its cap.
func (f *forwarder) acquire(g *guard) bool {
	if !take(&g.inflight, maxSlotInflight) {
		return false
	}
	if !take(&f.all.inflight, maxInflight) {
		g.inflight.Add(-1)
		return false
	}
	return true
}

func (f *forwarder) release(g *guard) {
	g.inflight.Add(-1)
	f.all.inflight.Add(-1)
}

// guardedListener closes a connection at once when its slot, or all
// slots, hold as many as they may.
type guardedListener struct {
	net.Listener
	slot, all *guard
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !take(&l.slot.conns, maxSlotConns) {
			c.Close()
			continue
		}
		if !take(&l.all.conns, maxConns) {
			l.slot.conns.Add(-1)
			c.Close()
			continue
		}
		return &guardedConn{Conn: c, l: l}, nil
	}
}

type guardedConn struct {
	net.Conn
	l    *guardedListener
	once sync.Once
}

func (c *guardedConn) Close() error {
	c.once.Do(func() {
		c.l.slot.conns.Add(-1)
		c.l.all.conns.Add(-1)
	})
	return c.Conn.Close()
}
