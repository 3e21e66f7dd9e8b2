package snapstore

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// SweepRootsAt sweeps the unneeded roots as at now.
func (c *Copies) SweepRootsAt(ctx context.Context, now time.Time) { c.sweepRoots(ctx, now) }

// WithoutOpenat2 makes the store's opens answer as a kernel (or a seccomp
// filter) without openat2 does, with errno, until the test ends.
func WithoutOpenat2(t interface{ Cleanup(func()) }, errno error) {
	old := openat2
	openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, errno }
	t.Cleanup(func() { openat2 = old })
}
