package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	sqlite "modernc.org/sqlite"
)

// A full disk must not lock the operator out of the one thing that frees
// it: removing a sandbox, a snapshot or a volume writes to the database
// first, and SQLite cannot write on a full disk. So the store keeps a
// reserve, a small preallocated file beside the database, and gives it up
// for a write made under ForCleanup that the full disk refused, then
// retries that write once. Other writes never use it (a create on a full
// disk is refused as before); the reserve is made again once the file
// system has room.
const (
	reserveSize = 4 << 20
	// reserveRoom is the free space the file system must have before the
	// reserve is made again.
	reserveRoom = 64 << 20
)

type reserve struct {
	path string

	mu        sync.Mutex
	held      bool
	lastTried time.Time
}

type cleanupKey struct{}

// ForCleanup marks ctx's writes as ones that free space (a removal): on a
// full disk they may use the store's reserve.
func ForCleanup(ctx context.Context) context.Context {
	return context.WithValue(ctx, cleanupKey{}, true)
}

func forCleanup(ctx context.Context) bool {
	v, _ := ctx.Value(cleanupKey{}).(bool)
	return v
}

// make creates the reserve if it is missing and the file system has room
// (at most every 30 s: it is called after writes).
func (r *reserve) make() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held || time.Since(r.lastTried) < 30*time.Second {
		return
	}
	r.lastTried = time.Now()
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(r.path), &st); err != nil || st.Bavail*uint64(st.Bsize) < reserveRoom {
		return
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, reserveSize); err != nil {
		_ = os.Remove(r.path)
		return
	}
	r.held = true
}

// release gives the reserve up, reporting whether there was one.
func (r *reserve) release() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return false
	}
	r.held = false
	r.lastTried = time.Now()
	return os.Remove(r.path) == nil
}

func isFull(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqliteFull
}

// write runs f, a write; when the full disk refuses a write made under
// ForCleanup, it gives up the reserve and runs f once more.
func (s *Store) write(ctx context.Context, f func() error) error {
	err := f()
	if err != nil && isFull(err) && forCleanup(ctx) && s.reserve.release() {
		err = f()
	}
	if err == nil {
		s.reserve.make()
	}
	return s.classify(err)
}
