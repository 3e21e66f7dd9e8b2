package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
)

// Traffic is which sandboxes run now and how they are used: their live
// engine sandboxes (a request's hot path is a lookup here, no database
// read), the last request to each, when each last woke, and the traffic
// held on each (Hold). The lifetime policy reads it to tell idle
// sandboxes from busy ones; the ingress and port forwarding dial through
// it. It makes no engine or store call of its own.
type Traffic struct {
	hooks hookChain // the PortDialers
	// life brings a sandbox to running for a dial: the lifecycle.
	life readier

	mu       sync.Mutex
	live     map[string]engine.Sandbox // guarded by mu: the running sandboxes' engine sandboxes
	lastUsed map[string]time.Time      // guarded by mu: last request per sandbox
	wokeAt   map[string]time.Time      // guarded by mu: when each live sandbox last woke
	holds    map[string]int            // guarded by mu: traffic in flight per sandbox (Hold)
	// dialed are the connections a PortDialer hook made to each live
	// engine sandbox (over its own veth), closed when it stops being
	// live (drop: a sleep, a removal): a TCP connection to a sandbox put
	// to sleep never hears that it is gone (gVisor's reset at the
	// checkpoint does not always arrive), so its client would wait for
	// an answer forever instead of seeing an EOF and dialing again, which
	// wakes it. Guarded by mu.
	dialed map[engine.Sandbox][]net.Conn
}

// readier is what Traffic needs of the lifecycle: the engine sandbox of a
// running sandbox, its agent ready, waking it first only when wake says so.
type readier interface {
	ready(ctx context.Context, ref string, wake bool) (engine.Sandbox, error)
}

func newTraffic(hooks hookChain, life readier) *Traffic {
	return &Traffic{hooks: hooks, life: life, live: map[string]engine.Sandbox{}, lastUsed: map[string]time.Time{},
		wokeAt: map[string]time.Time{}, holds: map[string]int{}, dialed: map[engine.Sandbox][]net.Conn{}}
}

// use returns the live engine sandbox of id (an id, not a name) and counts
// a request to it; nil when it does not run.
func (t *Traffic) use(id string) engine.Sandbox {
	t.mu.Lock()
	defer t.mu.Unlock()
	sb := t.live[id]
	if sb != nil {
		t.lastUsed[id] = time.Now()
	}
	return sb
}

// get returns the live engine sandbox of id, nil when it does not run.
func (t *Traffic) get(id string) engine.Sandbox {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live[id]
}

// touch records a request to a sandbox, for the pressure sleeper's LRU.
func (t *Traffic) touch(id string) {
	t.mu.Lock()
	t.lastUsed[id] = time.Now()
	t.mu.Unlock()
}

// put makes sb the live engine sandbox of id, used now.
func (t *Traffic) put(id string, sb engine.Sandbox) {
	t.mu.Lock()
	t.live[id] = sb
	t.lastUsed[id] = time.Now()
	t.mu.Unlock()
}

// relive puts back a live engine sandbox that an operation had dropped
// (a sleep that failed). Its idle time starts again: the drop forgot its
// last use, and a sandbox that looked idle for ever would be tried again
// by the idle sleeper every tick (a checkpoint each time), and first by
// the pressure sleeper.
func (t *Traffic) relive(id string, sb engine.Sandbox) {
	if sb == nil {
		return
	}
	t.mu.Lock()
	sb.Guest().Unretire()
	t.live[id] = sb
	t.lastUsed[id] = time.Now()
	t.mu.Unlock()
}

// woke records that id woke now.
func (t *Traffic) woke(id string) {
	t.mu.Lock()
	t.wokeAt[id] = time.Now()
	t.mu.Unlock()
}

// drop forgets a sandbox's engine sandbox, so requests take the slow
// path and wait for the sandbox's lock. It returns what was live.
func (t *Traffic) drop(id string) engine.Sandbox {
	t.mu.Lock()
	sb, conns := t.dropLocked(id)
	t.mu.Unlock()
	closeConns(conns)
	return sb
}

// dropLocked is drop's part under mu: it returns what was live and the
// connections dialed to it, for the caller to close once mu is released.
func (t *Traffic) dropLocked(id string) (engine.Sandbox, []net.Conn) {
	sb := t.live[id]
	delete(t.live, id)
	delete(t.lastUsed, id)
	delete(t.wokeAt, id)
	conns := t.dialed[sb]
	delete(t.dialed, sb)
	return sb, conns
}

// closeConns closes the connections a drop took from a sandbox. Their
// clients see an EOF and dial again (a wake). A drop undone (relive: a
// sleep that failed) costs them a reconnection only.
func closeConns(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// retire takes live sandbox id out of service for a sleep if it is idle:
// no exec, attach or file call in flight on its agent, no hold (a proxied
// request or connection), and no request for quiet (nor for
// lookupGrace); with quiet asAsked (a sleep asked for), whatever it does.
// The look and the drop are one step under mu, and its agent connection
// is retired (guest.Conn.Retire) in the same step, so a call is on one
// side of it: one that found the sandbox live before (its lookup counts
// as a use) and opened its call makes the sleeper back off; one that
// comes after finds it gone from live and waits for the sandbox's lock,
// which the sleeper holds, then wakes it (or is refused, if it does not
// wake); one that looked it up before but opens its call only after (a
// lookup older than lookupGrace) is refused by the connection before it
// starts (guest.ErrRetired), and looks again as one that comes after. It
// returns what was live (the caller's to relive if the sleep fails) and
// "", or nil and why the sandbox is busy.
func (t *Traffic) retire(id string, quiet time.Duration) (engine.Sandbox, string) {
	t.mu.Lock()
	why := ""
	if quiet != asAsked {
		why = t.busyLocked(id, quiet)
	}
	var (
		sb    engine.Sandbox
		conns []net.Conn
	)
	if why == "" {
		if live := t.live[id]; live != nil && !live.Guest().Retire(quiet == asAsked) {
			why = "an exec, attach or file call opened on it just now"
		} else {
			sb, conns = t.dropLocked(id)
		}
	}
	t.mu.Unlock()
	closeConns(conns)
	return sb, why
}

// busyWhy says why live sandbox id is not idle for quiet ("" when it is):
// what it is doing now, or how recently it was used. It is a first look
// only (the sandbox may be used right after it): retire decides.
func (t *Traffic) busyWhy(id string, quiet time.Duration) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.busyLocked(id, quiet)
}

// busyLocked is busyWhy under mu.
func (t *Traffic) busyLocked(id string, quiet time.Duration) string {
	sb := t.live[id]
	quiet = max(quiet, lookupGrace)
	switch {
	case sb == nil:
		return "it is not live"
	case sb.Guest().Active() > 0:
		return fmt.Sprintf("%d exec, attach or file calls in flight", sb.Guest().Active())
	case t.holds[id] > 0:
		return fmt.Sprintf("%d connections or proxied requests open", t.holds[id])
	case time.Since(t.lastUsed[id]) < quiet:
		return fmt.Sprintf("used in the last %s", quiet)
	}
	return ""
}

// lookupGrace is how long after a request looked a sandbox up (use: an
// exec, a file call, a dial) the sandbox counts as used whatever its idle
// time: the request holds the engine sandbox from its lookup on, but its
// agent counts its call (Active) or its proxy its hold only a moment
// later. A call slower than that between the two is not failed by the
// sleep (its connection refuses it unstarted, and it is tried again on
// the woken sandbox: retire), but it costs a sleep and a wake, which the
// grace spares the usual case.
var lookupGrace = time.Second

// track keeps c, dialed to sb by a PortDialer hook, for drop to close.
// It reports false (c is the caller's to close) when sb is no longer
// live: dropped while the dial was under way.
func (t *Traffic) track(sb engine.Sandbox, c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live[sb.ID()] != sb && !slices.Contains(slices.Collect(maps.Values(t.live)), sb) {
		return false
	}
	// Those their users closed go first (a closed socket's Control
	// fails), so a sandbox's list stays as long as its open connections.
	t.dialed[sb] = append(slices.DeleteFunc(t.dialed[sb], isClosed), c)
	return true
}

// isClosed reports whether the connection c was closed; one that cannot
// tell (no descriptor) counts as open.
func isClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}

// dropIf forgets id's engine sandbox if it is still sb, and reports
// whether it was.
func (t *Traffic) dropIf(id string, sb engine.Sandbox) bool {
	t.mu.Lock()
	current := t.live[id] == sb
	if current {
		delete(t.live, id)
	}
	conns := t.dialed[sb]
	delete(t.dialed, sb)
	t.mu.Unlock()
	closeConns(conns)
	return current
}

// isLive says whether sandbox id has a live engine sandbox.
func (t *Traffic) isLive(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, live := t.live[id]
	return live
}

// Hold marks sandbox id busy (a proxied request or connection in flight)
// until release is called: a busy sandbox is not put to sleep for being
// idle or for memory pressure, and its idle time starts at the release.
// release is idempotent.
func (t *Traffic) Hold(id string) (release func()) {
	t.mu.Lock()
	t.holds[id]++
	t.lastUsed[id] = time.Now()
	t.mu.Unlock()
	done := false
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if done {
			return
		}
		done = true
		if t.holds[id]--; t.holds[id] <= 0 {
			delete(t.holds, id)
		}
		if _, ok := t.lastUsed[id]; ok {
			t.lastUsed[id] = time.Now()
		}
	}
}

// Running reports whether sandbox id (an id, not a name) runs now: a map
// lookup, for callers that keep what they read of a running sandbox.
func (t *Traffic) Running(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live[id] != nil
}

// PortDialer is a hook that reaches a port of a running sandbox by a
// faster way than its agent's connection (the network hook: over the
// sandbox's own veth). It is given the sandbox's engine id, which is all
// it may need: a dial reads no record. An error sends the dial to the
// agent.
type PortDialer interface {
	DialPort(ctx context.Context, engineID string, port int) (net.Conn, error)
}

// DialWaking connects to port inside sandbox ref, waking the sandbox if
// it sleeps (as an exec does; concurrent dials to a sleeping sandbox wake
// it once): over a PortDialer hook's way when one reaches it (a server
// listening on the sandbox's own address), else through its agent to its
// loopback. Its errors are Guest's (NotFound, Conflict, the wake's: an
// Unavailable one when memory admission refused it, and the sandbox
// sleeps on) and the dial's: Unavailable saying that nothing listens on
// the port (after a wake, only once the port refused for portGrace). The
// caller should Hold the sandbox while it uses the connection.
func (t *Traffic) DialWaking(ctx context.Context, ref string, port int) (net.Conn, error) {
	return t.dial(ctx, ref, port, true)
}

// Dial is DialWaking for a sandbox that runs: a sleeping one is a
// Conflict, never woken.
func (t *Traffic) Dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	return t.dial(ctx, ref, port, false)
}

func (t *Traffic) dial(ctx context.Context, ref string, port int, wake bool) (net.Conn, error) {
	var (
		retry *time.Timer
		wait  = portRetry
		until time.Time // the hold's end: fixed by the wake it follows, never renewed
	)
	for attempt := 0; ; attempt++ {
		sb, err := t.life.ready(ctx, ref, wake)
		if err != nil {
			return nil, err
		}
		g := sb.Guest()
		if c := t.hooks.dialPort(ctx, sb.ID(), port); c != nil {
			if t.track(sb, c) {
				return c, nil
			}
			// The sandbox went to sleep (or away) under the dial: the
			// connection would never be answered.
			c.Close()
			if attempt > 0 {
				return nil, errdefs.New(errdefs.Unavailable, "sandbox %s stopped while port %d was dialed: retry", ref, port)
			}
			continue
		}
		c, err := g.Dial(ctx, port)
		if err == nil {
			return c, nil
		}
		if !errdefs.IsUnavailable(err) {
			return nil, err
		}
		if !t.isLiveGuest(g) {
			if attempt > 0 {
				return nil, err
			}
			// The sandbox was put to sleep (or restarted) under the dial:
			// the next try waits for that and wakes it (a dial that does
			// not wake is refused then).
			continue
		}
		// Nothing listens (yet). A sandbox that has just woken may not
		// serve the port at once (its network comes back as the wake
		// ends; a server may restart itself): the connection is held, not
		// refused, until the port accepts or the grace ends. A sandbox
		// that was not woken gets the refusal at once.
		if until.IsZero() {
			w, ok := t.wokeAtOf(g)
			if !ok || time.Since(w) >= portGrace {
				return nil, err
			}
			until = w.Add(portGrace)
		}
		if !time.Now().Before(until) {
			return nil, err
		}
		if retry == nil {
			retry = time.NewTimer(wait)
			defer retry.Stop()
		} else {
			retry.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-retry.C:
		}
		wait = min(2*wait, portRetryMax)
		// A sandbox put to sleep under the hold (its timeout, a sleep
		// asked for) is not woken again by it: the hold waits for a
		// server, not for a wake.
		if !t.isLiveGuest(g) {
			return nil, err
		}
	}
}

const (
	// portGrace is how long after a sandbox wakes a connection to a port
	// nothing listens on is held (retried) rather than refused.
	portGrace = 30 * time.Second
	// portRetry is the first pause between two tries within the grace:
	// short, since a woken server usually accepts within milliseconds of
	// the wake. The pauses double up to portRetryMax (many held
	// connections, e.g. requests whose clients left, must not poll the
	// agent many times a second each): seven tries in the first 130 ms.
	portRetry    = 2 * time.Millisecond
	portRetryMax = 500 * time.Millisecond
)

// wokeAtOf returns when g's sandbox last woke, if it is live and woke.
func (t *Traffic) wokeAtOf(g *guest.Conn) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, sb := range t.live {
		if sb.Guest() == g {
			w, ok := t.wokeAt[id]
			return w, ok
		}
	}
	return time.Time{}, false
}

// isLiveGuest reports whether g is the guest of a live sandbox.
func (t *Traffic) isLiveGuest(g *guest.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, sb := range t.live {
		if sb.Guest() == g {
			return true
		}
	}
	return false
}

// markBusy counts a sandbox with execs or transfers open, or held, as used
// now: its idle time starts when they end, not when they began.
func (t *Traffic) markBusy() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, sb := range t.live {
		if t.holds[id] > 0 || sb.Guest().Active() > 0 {
			t.lastUsed[id] = now
		}
	}
}

// idleFor reports whether live sandbox id has been idle for d.
func (t *Traffic) idleFor(id string, d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sb := t.live[id]
	if sb == nil || t.holds[id] > 0 || sb.Guest().Active() > 0 {
		return false
	}
	return time.Since(t.lastUsed[id]) >= d
}

// idleLRU returns the live sandboxes with no request for idleAfter, least
// recently used first.
func (t *Traffic) idleLRU() []string {
	now := time.Now()
	t.mu.Lock()
	type cand struct {
		id   string
		last time.Time
	}
	var cs []cand
	for id, sb := range t.live {
		last := t.lastUsed[id]
		if now.Sub(last) < idleAfter || sb.Guest().Active() > 0 || t.holds[id] > 0 {
			continue
		}
		cs = append(cs, cand{id, last})
	}
	t.mu.Unlock()
	slices.SortFunc(cs, func(a, b cand) int { return a.last.Compare(b.last) })
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.id
	}
	return ids
}
