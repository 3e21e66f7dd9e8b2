package sandbox

import "sync"

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
//   - Manager.mu guards only in-memory maps (live sandboxes, memory
//     reservations); it is never held across an engine or store call.
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
