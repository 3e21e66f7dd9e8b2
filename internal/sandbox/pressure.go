package sandbox

import (
	"context"
	"slices"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// idleAfter is how long a sandbox must have had no request to count as
// idle for the pressure sleeper.
var idleAfter = 2 * time.Second

// touch records a request to a sandbox, for the pressure sleeper's LRU.
func (m *Manager) touch(id string) {
	m.mu.Lock()
	m.lastUsed[id] = time.Now()
	m.mu.Unlock()
}

// WatchPressure puts the least recently used idle sandboxes to sleep while
// the host's MemAvailable is below Config.PressureFloorMiB, one at a time,
// until ctx ends: a sleeping sandbox holds no memory and wakes on its next
// request, which beats the kernel's OOM killer picking a victim.
func (m *Manager) WatchPressure(ctx context.Context) {
	if m.cfg.PressureFloorMiB <= 0 {
		return
	}
	snapper, err := m.snapshotter()
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
		if err != nil || avail >= m.cfg.PressureFloorMiB {
			continue
		}
		// Hot and prepared sandboxes hold memory nobody uses yet (up to
		// MaxTotal prepared ones of learned shapes): they go first.
		if n := m.flushHot(ctx) + m.pool.Flush(ctx); n > 0 {
			m.log.Warn("memory pressure: gave back the hot and warm pools", "sandboxes", n, "mem_available_mib", avail)
			continue
		}
		for _, id := range m.idleLRU() {
			if m.sleepForPressure(ctx, snapper, id, avail) {
				break
			}
		}
	}
}

// nearPressure refuses (Unavailable) a pool refill of what that would
// leave MemAvailable within headroom MiB of the pressure floor:
// WatchPressure would give it back at its next tick, and a tick whose
// flush gave something back sleeps no idle sandbox.
func (m *Manager) nearPressure(what string, headroom int) error {
	if m.cfg.PressureFloorMiB <= 0 {
		return nil
	}
	avail, err := memAvailableMiB()
	if err != nil || avail-headroom >= m.cfg.PressureFloorMiB {
		return nil
	}
	return errdefs.New(errdefs.Unavailable, "%s: %d MiB available, near the pressure floor (%d MiB): not refilled", what, avail, m.cfg.PressureFloorMiB)
}

// idleLRU returns the live sandboxes with no request for idleAfter, least
// recently used first.
func (m *Manager) idleLRU() []string {
	now := time.Now()
	m.mu.Lock()
	type cand struct {
		id   string
		last time.Time
	}
	var cs []cand
	for id, sb := range m.live {
		last := m.lastUsed[id]
		if now.Sub(last) < idleAfter || sb.Guest().Active() > 0 || m.holds[id] > 0 {
			continue
		}
		cs = append(cs, cand{id, last})
	}
	m.mu.Unlock()
	slices.SortFunc(cs, func(a, b cand) int { return a.last.Compare(b.last) })
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.id
	}
	return ids
}

// sleepForPressure puts one sandbox to sleep if it is still running and
// idle, and reports whether it did.
func (m *Manager) sleepForPressure(ctx context.Context, snapper engine.Snapshotter, id string, avail int) bool {
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.State != store.StateRunning {
		return false
	}
	m.mu.Lock()
	idle := time.Since(m.lastUsed[id]) >= idleAfter && m.holds[id] == 0
	m.mu.Unlock()
	if !idle || m.checkDisk("sleep") != nil {
		return false
	}
	if err := m.sleepLocked(ctx, snapper, &rec); err != nil {
		m.log.Warn("memory pressure: sleep failed", "sandbox", id, "err", err)
		return false
	}
	m.counters.PressureSleeps.Add(1)
	m.log.Warn("memory pressure: put the least recently used idle sandbox to sleep; it wakes on its next request",
		"sandbox", id, "available_mib", avail, "pressure_floor_mib", m.cfg.PressureFloorMiB)
	return true
}
