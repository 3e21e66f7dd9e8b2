package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// transitions is every state change a sandbox may make. Removal (the record
// deleted) is allowed from creating (a rolled back create) and destroying.
//
//	creating -> running | destroying
//	running -> suspending (sleep) | stopped (died by itself) | destroying
//	suspending -> sleeping | running (sleep failed) | stopped | destroying
//	sleeping -> waking | stopped (its image is gone) | destroying
//	waking -> running | sleeping (wake failed) | stopped | destroying
//	stopped -> destroying
var transitions = map[string][]string{
	store.StateCreating:   {store.StateRunning, store.StateDestroying},
	store.StateRunning:    {store.StateSuspending, store.StateStopped, store.StateDestroying},
	store.StateSuspending: {store.StateSleeping, store.StateRunning, store.StateStopped, store.StateDestroying},
	store.StateSleeping:   {store.StateWaking, store.StateStopped, store.StateDestroying},
	store.StateWaking:     {store.StateRunning, store.StateSleeping, store.StateStopped, store.StateDestroying},
	store.StateStopped:    {store.StateDestroying},
	store.StateDestroying: {store.StateDestroying},
}

// canMove reports whether a sandbox in state from may move to state to.
func canMove(from, to string) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// moveLocked records rec's move to state to, with msg as its last error,
// and updates rec. The move must be in the table and the store must still
// hold rec in its state: anything else is a bug, reported as Internal.
// Guarded by rec's lock.
func (m *Manager) moveLocked(ctx context.Context, rec *store.Sandbox, to, msg string) error {
	if !canMove(rec.State, to) {
		return errdefs.New(errdefs.Internal, "sandbox %s: no transition from %s to %s", rec.ID, rec.State, to)
	}
	if err := m.store.Transition(ctx, rec.ID, rec.State, to, msg); err != nil {
		return err
	}
	from := rec.State
	rec.State, rec.Error = to, msg
	m.events.emitMove(*rec, from, to, msg)
	return nil
}

// rollbackWait bounds how long rollbackLocked keeps retrying.
var rollbackWait = 2 * time.Minute

// rollbackLocked moves rec back to a state it is known to be in again
// (e.g. running, after a checkpoint that failed and left it running). On a
// full disk the store cannot record even that: it retries, holding rec's
// lock, until the write goes through or rollbackWait passes (a restart's
// reconcile then finds the truth from the engine). Guarded by rec's lock.
func (m *Manager) rollbackLocked(ctx context.Context, rec *store.Sandbox, to string) error {
	deadline := time.Now().Add(rollbackWait)
	wait := 100 * time.Millisecond
	for {
		err := m.moveLocked(ctx, rec, to, "")
		if err == nil || !errdefs.Is(err, errdefs.ResourceExhausted) || time.Now().After(deadline) {
			return err
		}
		if wait == 100*time.Millisecond {
			m.log.Warn("the database cannot record a rollback (disk full?); retrying", "sandbox", rec.ID, "state", to, "err", err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}
