package sandbox

import (
	"context"
	"sync"

	"github.com/clade-sandbox/clade/internal/store"
)

// keyedLocks is one mutex per key (a sandbox or snapshot id), made on first
// use and freed when its last holder or waiter lets go, so ids that come and
// go leave nothing behind.
//
// The lock model of the service (see docs/architecture.md):
//   - Every mutation of a sandbox (create, destroy, snapshot, sleep, wake,
//     the stop of a sandbox that died, the reconcile of it) holds that
//     sandbox's lock, and re-reads its record under it.
//   - A snapshot's lock is held while it is removed and while a fork takes
//     it as its source, so it cannot go from under a restore.
//   - Each part's own mutex (Traffic.mu, admission.mu, ...) guards only its
//     in-memory maps; none is held across an engine or store call.
//   - Lock order: a sandbox's lock before a snapshot's lock; never two
//     sandboxes' locks at once.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*refLock // guarded by mu
}

type refLock struct {
	sync.Mutex
	refs int // guarded by keyedLocks.mu
}

// lock takes the lock of key and returns its unlock.
func (k *keyedLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*refLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &refLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// len returns how many keys have a lock, for tests.
func (k *keyedLocks) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.locks)
}

// recordLocks are the per-id locks with the records they guard: a
// sandbox or snapshot found by reference, locked, and read again under the
// lock. Every part that mutates a sandbox takes its lock here.
type recordLocks struct {
	keys  keyedLocks
	recs  store.Sandboxes
	snaps store.Snapshots
}

// lock takes the lock of id (a sandbox or snapshot id) and returns its
// unlock.
func (l *recordLocks) lock(id string) (unlock func()) { return l.keys.lock(id) }

// len returns how many ids have a lock, for tests.
func (l *recordLocks) len() int { return l.keys.len() }

// sandbox finds a sandbox, takes its lock and reads it again under the
// lock: what an operation decides on must be current.
func (l *recordLocks) sandbox(ctx context.Context, ref string) (store.Sandbox, func(), error) {
	rec, err := l.recs.GetSandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, nil, err
	}
	unlock := l.lock(rec.ID)
	if rec, err = l.recs.GetSandbox(ctx, rec.ID); err != nil {
		unlock()
		return store.Sandbox{}, nil, err
	}
	return rec, unlock, nil
}

// snapshot finds a snapshot, takes its lock and reads it again.
func (l *recordLocks) snapshot(ctx context.Context, ref string) (store.Snapshot, func(), error) {
	sn, err := l.snaps.GetSnapshot(ctx, ref)
	if err != nil {
		return store.Snapshot{}, nil, err
	}
	unlock := l.lock(sn.ID)
	if sn, err = l.snaps.GetSnapshot(ctx, sn.ID); err != nil {
		unlock()
		return store.Snapshot{}, nil, err
	}
	return sn, unlock, nil
}
