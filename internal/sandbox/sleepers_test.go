package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestSleepersKeepPreparedSandboxes: each sandbox put to sleep asks the
// warm pool for one more prepared sandbox of its shape (up to the limit),
// so that a burst of wakes restores into prepared sandboxes.
func TestSleepersKeepPreparedSandboxes(t *testing.T) {
	const limit = 4
	e := newEnv(t, Config{WarmPool: limit})
	e.eng.Delay = time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.m.pools.warm.Run(ctx) // the pool alone: no pinned default shape
	var ids []string
	for range limit + 2 {
		ids = append(ids, e.create(t, 128).ID)
	}
	for _, id := range ids {
		if _, err := e.m.Sleep(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); e.m.Pools().Warm() < limit; {
		if time.Now().After(deadline) {
			t.Fatalf("%d sleepers: %d prepared sandboxes, want %d", len(ids), e.m.Pools().Warm(), limit)
		}
		time.Sleep(time.Millisecond) // polling the pool's count
	}
	hits0, _ := e.m.Pools().WarmStats()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.m.Wake(context.Background(), id); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if hits, _ := e.m.Pools().WarmStats(); hits-hits0 < limit {
		t.Fatalf("%d concurrent wakes found %d prepared sandboxes, want at least %d", len(ids), hits-hits0, limit)
	}
}

// TestPrepareYieldsToWakes: the warm pool prepares nothing while a wake
// restores, and catches up once it is done.
func TestPrepareYieldsToWakes(t *testing.T) {
	e := newEnv(t, Config{WarmPool: 2})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	e.m.wakes <- struct{}{} // a wake restoring
	go e.m.pools.warm.Run(ctx)
	sb := e.create(t, 128)
	e.m.pools.warm.Want(shapeOf(sb.Image, sb.MemoryMiB, sb.CPUs, sb.Env, sb.Opts), 2)
	// The pool would prepare within milliseconds; 5 poll periods later it
	// still must not have.
	deadline := time.Now().Add(5 * yieldPoll)
	for time.Now().Before(deadline) {
		if n := e.m.Pools().Warm(); n != 0 {
			t.Fatalf("%d sandboxes prepared while a wake restored", n)
		}
		time.Sleep(time.Millisecond) // sampling the count over a period
	}
	<-e.m.wakes
	for deadline := time.Now().Add(5 * time.Second); e.m.Pools().Warm() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("after the wake: %d prepared, want 2", e.m.Pools().Warm())
		}
		time.Sleep(time.Millisecond) // polling the pool's count
	}
}
