package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestTrafficAgreesWithRecordsUnderRaces runs sleeps, waking and
// non-waking reads, dials, holds and removals of the same sandboxes at
// once, and then checks that Traffic (live, last use, holds) agrees with
// the records: a sandbox is live only if its record says running, and a
// removed one leaves nothing behind.
func TestTrafficAgreesWithRecordsUnderRaces(t *testing.T) {
	e := newEnv(t, Config{})
	var ids []string
	for range 6 {
		ids = append(ids, e.create(t, 128).ID)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range ids {
		for w := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 15 {
					switch (w + i) % 5 {
					case 0:
						_, _ = e.m.Sleep(ctx, id)
					case 1:
						_, _ = e.m.GuestWaking(ctx, id)
					case 2:
						if _, err := e.m.Guest(ctx, id); err != nil && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) && !errdefs.IsUnavailable(err) {
							t.Errorf("Guest: %v", err)
						}
					case 3:
						release := e.m.Traffic().Hold(id)
						// Within a wake's port grace the refused dial is
						// held: cut it short.
						dctx, dcancel := context.WithTimeout(ctx, 20*time.Millisecond)
						_, _ = e.m.Traffic().Dial(dctx, id, 1)
						dcancel()
						release()
					case 4:
						_ = e.m.Traffic().Running(id)
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, id := range ids {
		st := e.state(t, id)
		if live := e.m.Traffic().Running(id); live != (st == store.StateRunning) {
			t.Errorf("sandbox %s is %s but Running says %v", id, st, live)
		}
	}
	for _, id := range ids[:3] {
		if err := e.m.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	tr := e.m.traffic
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, id := range ids[:3] {
		_, live := tr.live[id]
		_, used := tr.lastUsed[id]
		_, woke := tr.wokeAt[id]
		if live || used || woke || tr.holds[id] != 0 {
			t.Errorf("removed sandbox %s left traffic state: live %v, last use %v, woke %v, holds %d", id, live, used, woke, tr.holds[id])
		}
	}
}
