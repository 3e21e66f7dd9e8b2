package snapstore

import (
	"context"
	"time"
)

// SweepRootsAt sweeps the unneeded roots as at now.
func (c *Copies) SweepRootsAt(ctx context.Context, now time.Time) { c.sweepRoots(ctx, now) }
