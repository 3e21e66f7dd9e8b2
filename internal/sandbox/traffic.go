package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// This file is what the ingress and port forwarding need from the service:
// a connection to a port inside a sandbox (waking it), the sandbox held
// busy while traffic flows, and the lifetimes that traffic keeps going
// (idle sleep, timeouts).

// OnTimeout values: what a sandbox's timeout does.
const (
	OnTimeoutRemove = "rm"
	OnTimeoutSleep  = "sleep"
	// OnTimeoutSleepFiles sleeps keeping the files only (SleepFiles).
	OnTimeoutSleepFiles = "sleep-files"
)

// newTrafficToken returns a fresh traffic token.
func newTrafficToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// validLifetime checks a new sandbox's idle sleep and timeout settings and
// fills in their defaults.
func validLifetime(o *store.Options) error {
	if o.IdleSleepMS < 0 || o.IdleSleepMS > int64(guest.MaxTimeout/time.Millisecond) {
		return errdefs.New(errdefs.InvalidArgument, "idle sleep %d ms is out of range: give 0 for none, or 1 ms to %s", o.IdleSleepMS, guest.MaxTimeout)
	}
	return validTimeout(o.TimeoutMS, &o.OnTimeout)
}

func validTimeout(ms int64, onTimeout *string) error {
	if ms < 0 || ms > int64(guest.MaxTimeout/time.Millisecond) {
		return errdefs.New(errdefs.InvalidArgument, "timeout %d ms is out of range: give 0 for none, or 1 ms to %s", ms, guest.MaxTimeout)
	}
	switch *onTimeout {
	case "":
		if ms > 0 {
			*onTimeout = OnTimeoutRemove
		}
	case OnTimeoutRemove, OnTimeoutSleep, OnTimeoutSleepFiles:
	default:
		return errdefs.New(errdefs.InvalidArgument, "on_timeout %q: use %q (remove the sandbox), %q (put it to sleep) or %q (to sleep keeping its files only)", *onTimeout, OnTimeoutRemove, OnTimeoutSleep, OnTimeoutSleepFiles)
	}
	return nil
}

// freshOptions gives a new sandbox (created, or a fork child inheriting
// its parent's options) its own traffic token, and starts its timeout.
func freshOptions(o store.Options, now time.Time) store.Options {
	o.TrafficToken = newTrafficToken()
	o.ExpiresAt = nil
	if o.TimeoutMS > 0 {
		t := now.Add(time.Duration(o.TimeoutMS) * time.Millisecond)
		o.ExpiresAt = &t
	}
	return o
}

// Hold marks sandbox id busy (a proxied request or connection in flight)
// until release is called: a busy sandbox is not put to sleep for being
// idle or for memory pressure, and its idle time starts at the release.
// release is idempotent.
func (m *Manager) Hold(id string) (release func()) {
	m.mu.Lock()
	m.holds[id]++
	m.lastUsed[id] = time.Now()
	m.mu.Unlock()
	done := false
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if done {
			return
		}
		done = true
		if m.holds[id]--; m.holds[id] <= 0 {
			delete(m.holds, id)
		}
		if _, ok := m.lastUsed[id]; ok {
			m.lastUsed[id] = time.Now()
		}
	}
}

// Running reports whether sandbox id (an id, not a name) runs now: a map
// lookup, for callers that keep what they read of a running sandbox.
func (m *Manager) Running(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id] != nil
}

// PortDialer is a hook that reaches a port of a running sandbox by a
// faster way than its agent's connection (the network hook: over the
// sandbox's own veth). It is given the sandbox's engine id, which is all
// it may need: a dial reads no record. An error sends the dial to the
// agent.
type PortDialer interface {
	DialPort(ctx context.Context, engineID string, port int) (net.Conn, error)
}

// Dial connects to port inside sandbox ref, waking the sandbox if it
// sleeps (as an exec does; concurrent dials to a sleeping sandbox wake it
// once): over a PortDialer hook's way when one reaches it (a server
// listening on the sandbox's own address), else through its agent to its
// loopback. Its errors are Guest's (NotFound, Conflict, the wake's: an
// Unavailable one when memory admission refused it, and the sandbox
// sleeps on) and the dial's: Unavailable saying that nothing listens on
// the port (after a wake, only once the port refused for portGrace). The
// caller should Hold the sandbox while it uses the connection.
func (m *Manager) Dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	var (
		retry *time.Timer
		wait  = portRetry
		until time.Time // the hold's end: fixed by the wake it follows, never renewed
	)
	for attempt := 0; ; attempt++ {
		sb, err := m.ready(ctx, ref)
		if err != nil {
			return nil, err
		}
		g := sb.Guest()
		if c := m.dialDirect(ctx, sb.ID(), port); c != nil {
			return c, nil
		}
		c, err := g.Dial(ctx, port)
		if err == nil {
			return c, nil
		}
		if !errdefs.IsUnavailable(err) {
			return nil, err
		}
		if !m.isLiveGuest(g) {
			if attempt > 0 {
				return nil, err
			}
			// The sandbox was put to sleep (or restarted) under the dial:
			// the next try waits for that and wakes it.
			continue
		}
		// Nothing listens (yet). A sandbox that has just woken may not
		// serve the port at once (its network comes back as the wake
		// ends; a server may restart itself): the connection is held, not
		// refused, until the port accepts or the grace ends. A sandbox
		// that was not woken gets the refusal at once.
		if until.IsZero() {
			w, ok := m.wokeAtOf(g)
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
		if !m.isLiveGuest(g) {
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
func (m *Manager) wokeAtOf(g *guest.Conn) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, sb := range m.live {
		if sb.Guest() == g {
			w, ok := m.wokeAt[id]
			return w, ok
		}
	}
	return time.Time{}, false
}

// dialDirect tries the PortDialer hooks on the engine sandbox engineID;
// nil when none reached port.
func (m *Manager) dialDirect(ctx context.Context, engineID string, port int) net.Conn {
	for _, h := range m.cfg.Hooks {
		if pd, ok := h.(PortDialer); ok {
			if c, err := pd.DialPort(ctx, engineID, port); err == nil {
				return c
			}
		}
	}
	return nil
}

// isLiveGuest reports whether g is the guest of a live sandbox.
func (m *Manager) isLiveGuest(g *guest.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.live {
		if sb.Guest() == g {
			return true
		}
	}
	return false
}

// SetTimeout renews (or with 0 removes) a sandbox's timeout: it now ends d
// from now. onTimeout, when not empty, replaces what happens then.
func (m *Manager) SetTimeout(ctx context.Context, ref string, d time.Duration, onTimeout string) (store.Sandbox, error) {
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "timeout %s is not a whole number of milliseconds", d)
	}
	rec, unlock, err := m.lockSandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	o := rec.Opts
	if onTimeout != "" {
		o.OnTimeout = onTimeout
	}
	if ms == 0 {
		o.OnTimeout = onTimeout
	}
	if err := validTimeout(ms, &o.OnTimeout); err != nil {
		return store.Sandbox{}, err
	}
	switch rec.State {
	case store.StateStopped, store.StateDestroying:
		return store.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s: its timeout cannot be renewed", ref, rec.State)
	}
	o.TimeoutMS = ms
	o.ExpiresAt = nil
	if ms > 0 {
		t := time.Now().Add(d)
		o.ExpiresAt = &t
	}
	if err := m.store.SetOptions(ctx, rec.ID, o); err != nil {
		return store.Sandbox{}, err
	}
	rec.Opts = o
	return rec, nil
}

// rearmLocked starts a woken sandbox's timeout again when a timeout had
// put it to sleep. Guarded by rec's lock.
func (m *Manager) rearmLocked(ctx context.Context, rec *store.Sandbox) {
	if rec.Opts.TimeoutMS <= 0 || rec.Opts.ExpiresAt != nil {
		return
	}
	o := freshOptions(rec.Opts, time.Now())
	o.TrafficToken = rec.Opts.TrafficToken
	if err := m.store.SetOptions(ctx, rec.ID, o); err != nil {
		m.log.Warn("rearm timeout after wake", "sandbox", rec.ID, "err", err)
		return
	}
	rec.Opts = o
}

// lifetimeEvery is how often WatchLifetimes looks at the sandboxes.
const lifetimeEvery = 200 * time.Millisecond

// WatchLifetimes applies idle sleeps and timeouts until ctx ends: a sandbox
// with an idle sleep sleeps once it has had no exec, file transfer, port
// connection or proxied request for that long; a sandbox whose timeout
// passed is removed or put to sleep, as it asked.
func (m *Manager) WatchLifetimes(ctx context.Context) {
	t := time.NewTicker(lifetimeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.markBusy()
		recs, err := m.store.ListSandboxes(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for _, rec := range recs {
			if ctx.Err() != nil {
				return
			}
			o := rec.Opts
			switch {
			case o.ExpiresAt != nil && now.After(*o.ExpiresAt) && (rec.State == store.StateRunning || rec.State == store.StateSleeping):
				m.expire(ctx, rec.ID)
			case o.IdleSleepMS > 0 && rec.State == store.StateRunning && m.idleFor(rec.ID, time.Duration(o.IdleSleepMS)*time.Millisecond):
				m.sleepIdle(ctx, rec.ID)
			}
		}
	}
}

// markBusy counts a sandbox with execs or transfers open, or held, as used
// now: its idle time starts when they end, not when they began.
func (m *Manager) markBusy() {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, sb := range m.live {
		if m.holds[id] > 0 || sb.Guest().Active() > 0 {
			m.lastUsed[id] = now
		}
	}
}

// idleFor reports whether live sandbox id has been idle for d.
func (m *Manager) idleFor(id string, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.live[id]
	if sb == nil || m.holds[id] > 0 || sb.Guest().Active() > 0 {
		return false
	}
	return time.Since(m.lastUsed[id]) >= d
}

// sleepIdle puts a sandbox that is still running and idle to sleep.
func (m *Manager) sleepIdle(ctx context.Context, id string) {
	snapper, err := m.snapshotter()
	if err != nil {
		return
	}
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.State != store.StateRunning || rec.Opts.IdleSleepMS <= 0 ||
		!m.idleFor(id, time.Duration(rec.Opts.IdleSleepMS)*time.Millisecond) {
		return
	}
	if err := m.checkDisk("sleep"); err != nil {
		m.log.Warn("idle sleep refused", "sandbox", id, "err", err)
		return
	}
	if err := m.sleepLocked(context.WithoutCancel(ctx), snapper, &rec); err != nil {
		m.log.Warn("idle sleep failed", "sandbox", id, "err", err)
		return
	}
	m.counters.IdleSleeps.Add(1)
	m.log.Info("idle sandbox put to sleep; it wakes on its next request", "sandbox", id, "idle_sleep", time.Duration(rec.Opts.IdleSleepMS)*time.Millisecond)
}

// expire applies a sandbox's timeout, if it has still passed.
func (m *Manager) expire(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx)
	rec, unlock, err := m.lockSandbox(ctx, id)
	if err != nil {
		return
	}
	defer unlock()
	o := rec.Opts
	if o.ExpiresAt == nil || time.Now().Before(*o.ExpiresAt) {
		return // renewed meanwhile
	}
	switch o.OnTimeout {
	case OnTimeoutSleep, OnTimeoutSleepFiles:
		if rec.State == store.StateRunning {
			if o.OnTimeout == OnTimeoutSleepFiles {
				ctx = context.WithValue(ctx, filesOnlyKey{}, true)
			}
			snapper, err := m.snapshotter()
			if err == nil {
				err = m.checkDisk("sleep")
			}
			if err == nil {
				err = m.sleepLocked(ctx, snapper, &rec)
			}
			if err != nil {
				m.log.Warn("timeout: sleep failed; retrying", "sandbox", id, "err", err)
				return
			}
		}
		// The timeout is spent; a wake starts the next one.
		o.ExpiresAt = nil
		if err := m.store.SetOptions(ctx, id, o); err != nil {
			m.log.Warn("timeout: record", "sandbox", id, "err", err)
		}
		m.counters.TimeoutSleeps.Add(1)
		m.log.Info("sandbox timed out: asleep", "sandbox", id)
	default:
		if live := m.dropLive(id); live != nil {
			live.Guest().Close(errdefs.New(errdefs.NotFound, "sandbox %s was removed: its timeout passed", id))
		}
		if err := m.destroyLocked(ctx, rec); err != nil {
			m.log.Warn("timeout: remove failed", "sandbox", id, "err", err)
			return
		}
		m.gcSnapshot(ctx, rec.Snapshot)
		m.gcStaleRoot(ctx, rec.Image, rec.RootFS)
		m.counters.TimeoutRemovals.Add(1)
		m.log.Info("sandbox timed out: removed", "sandbox", id)
	}
}
