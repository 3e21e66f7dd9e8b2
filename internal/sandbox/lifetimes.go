package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// The lifetime policy: a sandbox's idle sleep and timeout (applied by
// WatchLifetimes), and the memory pressure sleeper (pressure.go).

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

// Lifetimes is the lifetime policy: sandboxes' timeouts and idle sleeps
// (WatchLifetimes) and the memory pressure sleeper (WatchPressure). Its
// state is in the records (a sandbox's options) and in Traffic (what is
// idle); it acts through the lifecycle (a sleep, a removal), under each
// sandbox's lock.
type Lifetimes struct {
	cfg       Config // PressureFloorMiB
	eng       engine.Engine
	recs      store.Sandboxes
	locks     *recordLocks
	traffic   *Traffic
	images    *Images // the image roots a removed sandbox stood on
	admission *admission
	counters  *Counters
	log       *slog.Logger
	life      lifetimeOps
	// flushPools gives back the pools' sandboxes (memory is short) and
	// returns how many.
	flushPools func(context.Context) int
}

// lifetimeOps is what the lifetime policy needs of the lifecycle: a sleep
// (sleepLocked: as asked, or only if the sandbox is idle, for the idle and
// pressure sleepers) and a removal of a sandbox whose lock it holds, and the
// collection of the implicit snapshot a removed sandbox stood on.
type lifetimeOps interface {
	sleepLocked(ctx context.Context, snapper engine.Snapshotter, rec *store.Sandbox, quiet time.Duration) (busy string, err error)
	destroyLocked(ctx context.Context, rec store.Sandbox) error
	gcSnapshot(ctx context.Context, id string)
}

// SetTimeout renews (or with 0 removes) a sandbox's timeout: it now ends d
// from now. onTimeout, when not empty, replaces what happens then.
func (l *Lifetimes) SetTimeout(ctx context.Context, ref string, d time.Duration, onTimeout string) (store.Sandbox, error) {
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "timeout %s is not a whole number of milliseconds", d)
	}
	rec, unlock, err := l.locks.sandbox(ctx, ref)
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
	if err := l.recs.SetOptions(ctx, rec.ID, o); err != nil {
		return store.Sandbox{}, err
	}
	rec.Opts = o
	return rec, nil
}

// rearmLocked starts a woken sandbox's timeout again when a timeout had
// put it to sleep. Guarded by rec's lock.
func (l *Lifetimes) rearmLocked(ctx context.Context, rec *store.Sandbox) {
	if rec.Opts.TimeoutMS <= 0 || rec.Opts.ExpiresAt != nil {
		return
	}
	o := freshOptions(rec.Opts, time.Now())
	o.TrafficToken = rec.Opts.TrafficToken
	if err := l.recs.SetOptions(ctx, rec.ID, o); err != nil {
		l.log.Warn("rearm timeout after wake", "sandbox", rec.ID, "err", err)
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
func (l *Lifetimes) WatchLifetimes(ctx context.Context) {
	t := time.NewTicker(lifetimeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.traffic.markBusy()
		recs, err := l.recs.ListSandboxes(ctx)
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
				l.expire(ctx, rec.ID)
			case o.IdleSleepMS > 0 && rec.State == store.StateRunning && l.traffic.idleFor(rec.ID, time.Duration(o.IdleSleepMS)*time.Millisecond):
				l.sleepIdle(ctx, rec.ID)
			}
		}
	}
}

// sleepIdle puts a sandbox that is still running and idle to sleep.
func (l *Lifetimes) sleepIdle(ctx context.Context, id string) {
	snapper, err := snapshotterOf(l.eng)
	if err != nil {
		return
	}
	unlock := l.locks.lock(id)
	defer unlock()
	rec, err := l.recs.GetSandbox(ctx, id)
	if err != nil || rec.State != store.StateRunning || rec.Opts.IdleSleepMS <= 0 ||
		!l.traffic.idleFor(id, time.Duration(rec.Opts.IdleSleepMS)*time.Millisecond) {
		return
	}
	if err := l.admission.checkDisk("sleep"); err != nil {
		l.log.Warn("idle sleep refused", "sandbox", id, "err", err)
		return
	}
	busy, err := l.life.sleepLocked(context.WithoutCancel(ctx), snapper, &rec, time.Duration(rec.Opts.IdleSleepMS)*time.Millisecond)
	if err != nil {
		l.log.Warn("idle sleep failed", "sandbox", id, "err", err)
		return
	}
	if busy != "" {
		return // used since the first look
	}
	l.counters.IdleSleeps.Add(1)
	l.log.Info("idle sandbox put to sleep; it wakes on its next request", "sandbox", id, "idle_sleep", time.Duration(rec.Opts.IdleSleepMS)*time.Millisecond)
}

// expire applies a sandbox's timeout, if it has still passed.
func (l *Lifetimes) expire(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx)
	rec, unlock, err := l.locks.sandbox(ctx, id)
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
			snapper, err := snapshotterOf(l.eng)
			if err == nil {
				err = l.admission.checkDisk("sleep")
			}
			if err == nil {
				_, err = l.life.sleepLocked(ctx, snapper, &rec, asAsked)
			}
			if err != nil {
				l.log.Warn("timeout: sleep failed; retrying", "sandbox", id, "err", err)
				return
			}
		}
		// The timeout is spent; a wake starts the next one.
		o.ExpiresAt = nil
		if err := l.recs.SetOptions(ctx, id, o); err != nil {
			l.log.Warn("timeout: record", "sandbox", id, "err", err)
		}
		l.counters.TimeoutSleeps.Add(1)
		l.log.Info("sandbox timed out: asleep", "sandbox", id)
	default:
		if live := l.traffic.drop(id); live != nil {
			live.Guest().Close(errdefs.New(errdefs.NotFound, "sandbox %s was removed: its timeout passed", id))
		}
		if err := l.life.destroyLocked(ctx, rec); err != nil {
			l.log.Warn("timeout: remove failed", "sandbox", id, "err", err)
			return
		}
		l.life.gcSnapshot(ctx, rec.Snapshot)
		l.images.gcStaleRoot(ctx, rec.Image, rec.RootFS)
		l.counters.TimeoutRemovals.Add(1)
		l.log.Info("sandbox timed out: removed", "sandbox", id)
	}
}
