package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/clade-sandbox/clade/internal/engine"
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

// reaper runs those teardowns: one at a time per engine id.
type reaper struct {
	eng   engine.Engine
	hooks hookChain // AfterStop frees the hooks' state of the run
	log   *slog.Logger

	mu      sync.Mutex
	reaping map[string]chan struct{} // guarded by mu: engine ids a sleep tears down
	reaps   sync.WaitGroup           // the teardowns in flight
}

// reapLater tears down rec's stopped engine sandbox and its hooks' state
// in the background. Called with rec's lock held; the lock need not be
// held for the teardown.
func (r *reaper) reapLater(rec store.Sandbox) {
	id := rec.Engine()
	r.awaitReap(id) // one teardown per engine id at a time
	done := make(chan struct{})
	r.mu.Lock()
	r.reaping[id] = done
	r.mu.Unlock()
	r.reaps.Add(1)
	go func() {
		defer r.reaps.Done()
		defer func() {
			r.mu.Lock()
			delete(r.reaping, id)
			r.mu.Unlock()
			close(done)
		}()
		ctx := context.Background()
		if err := errors.Join(r.eng.Destroy(ctx, id), r.hooks.afterStop(ctx, rec)); err != nil {
			r.log.Warn("sleep: cleanup failed; the next start retries", "sandbox", rec.ID, "engine_sandbox", id, "err", err)
		}
	}()
}

// awaitReap waits until no teardown of engine id is in flight.
func (r *reaper) awaitReap(id string) {
	r.mu.Lock()
	done := r.reaping[id]
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

// wait waits for every teardown in flight.
func (r *reaper) wait() { r.reaps.Wait() }
