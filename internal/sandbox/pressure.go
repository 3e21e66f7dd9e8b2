package sandbox

import (
	"context"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// idleAfter is how long a sandbox must have had no request to count as
// idle for the pressure sleeper.
var idleAfter = 2 * time.Second

// WatchPressure puts the least recently used idle sandboxes to sleep while
// the host's MemAvailable is below Config.PressureFloorMiB, one at a time,
// until ctx ends: a sleeping sandbox holds no memory and wakes on its next
// request, which beats the kernel's OOM killer picking a victim.
func (l *Lifetimes) WatchPressure(ctx context.Context) {
	if l.cfg.PressureFloorMiB <= 0 {
		return
	}
	snapper, err := snapshotterOf(l.eng)
	if err != nil {
		return
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		avail, err := memAvailableMiB()
		if err != nil || avail >= l.cfg.PressureFloorMiB {
			continue
		}
		// Hot and prepared sandboxes hold memory nobody uses yet (up to
		// MaxTotal prepared ones of learned shapes): they go first.
		if n := l.flushPools(ctx); n > 0 {
			l.log.Warn("memory pressure: gave back the hot and warm pools", "sandboxes", n, "mem_available_mib", avail)
			continue
		}
		for _, id := range l.traffic.idleLRU() {
			if l.sleepForPressure(ctx, snapper, id, avail) {
				break
			}
		}
	}
}

// nearPressure refuses (Unavailable) a pool refill of what that would
// leave MemAvailable within headroom MiB of the pressure floor:
// WatchPressure would give it back at its next tick, and a tick whose
// flush gave something back sleeps no idle sandbox.
func (a *admission) nearPressure(what string, headroom int) error {
	if a.cfg.PressureFloorMiB <= 0 {
		return nil
	}
	avail, err := memAvailableMiB()
	if err != nil || avail-headroom >= a.cfg.PressureFloorMiB {
		return nil
	}
	return errdefs.New(errdefs.Unavailable, "%s: %d MiB available, near the pressure floor (%d MiB): not refilled", what, avail, a.cfg.PressureFloorMiB)
}

// sleepForPressure puts one sandbox to sleep if it is still running and
// idle, and reports whether it did.
func (l *Lifetimes) sleepForPressure(ctx context.Context, snapper engine.Snapshotter, id string, avail int) bool {
	unlock := l.locks.lock(id)
	defer unlock()
	rec, err := l.recs.GetSandbox(ctx, id)
	if err != nil || rec.State != store.StateRunning {
		return false
	}
	if l.traffic.busyWhy(id, idleAfter) != "" || l.admission.checkDisk("sleep") != nil {
		return false
	}
	busy, err := l.life.sleepLocked(ctx, snapper, &rec, idleAfter)
	if err != nil {
		l.log.Warn("memory pressure: sleep failed", "sandbox", id, "err", err)
		return false
	}
	if busy != "" {
		return false // used since idleLRU's look
	}
	l.counters.PressureSleeps.Add(1)
	l.log.Warn("memory pressure: put the least recently used idle sandbox to sleep; it wakes on its next request",
		"sandbox", id, "available_mib", avail, "pressure_floor_mib", l.cfg.PressureFloorMiB)
	return true
}
