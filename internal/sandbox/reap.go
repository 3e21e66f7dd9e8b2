package sandbox

import (
	"context"
	"errors"

	"github.com/clade-sandbox/clade/internal/store"
)

// A sleep answers once the sandbox is asleep: its image sealed, its
// sandbox process killed (its memory free) and its record sleeping. What
// is left of its engine sandbox (runsc's record, the gofer, the cgroup) and
// of the hooks' state (the network slot) is torn down after that, in the
// background: each is a process start or a netlink batch, 40-100 ms on a
// busy host, that nobody waits for.
//
// Whatever starts or destroys that engine id first waits for the teardown
// (awaitReap in startLocked and destroyLocked). A daemon killed meanwhile
// leaves a sleeping record: reconcile destroys what is left under its
// engine id and reclaims its slot, as after a sleep whose cleanup failed.

// reapLater tears down rec's stopped engine sandbox and its hooks' state
// in the background. Called with rec's lock held; the lock need not be
// held for the teardown.
func (m *Manager) reapLater(rec store.Sandbox) {
	id := rec.Engine()
	m.awaitReap(id) // one teardown per engine id at a time
	done := make(chan struct{})
	m.mu.Lock()
	m.reaping[id] = done
	m.mu.Unlock()
	m.reaps.Add(1)
	go func() {
		defer m.reaps.Done()
		defer func() {
			m.mu.Lock()
			delete(m.reaping, id)
			m.mu.Unlock()
			close(done)
		}()
		ctx := context.Background()
		if err := errors.Join(m.eng.Destroy(ctx, id), m.afterStop(ctx, rec)); err != nil {
			m.log.Warn("sleep: cleanup failed; the next start retries", "sandbox", rec.ID, "engine_sandbox", id, "err", err)
		}
	}()
}

// awaitReap waits until no teardown of engine id is in flight.
func (m *Manager) awaitReap(id string) {
	m.mu.Lock()
	done := m.reaping[id]
	m.mu.Unlock()
	if done != nil {
		<-done
	}
}
