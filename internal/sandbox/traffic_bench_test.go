package sandbox

import (
	"context"
	"testing"
)

// BenchmarkGuestHot is what every exec, attach and file call of a running
// sandbox asks before it talks to the agent (GuestWaking: the lookup in
// Traffic and the agent's readiness): a map lookup under Traffic.mu, no
// record read, no sandbox lock.
func BenchmarkGuestHot(b *testing.B) {
	e := newEnv(b, Config{})
	rec, err := e.m.Create(b.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		if _, err := e.m.GuestWaking(ctx, rec.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuestHotParallel is BenchmarkGuestHot from every core at once,
// on one sandbox: Traffic.mu is the one lock they share.
func BenchmarkGuestHotParallel(b *testing.B) {
	e := newEnv(b, Config{})
	rec, err := e.m.Create(b.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := e.m.GuestWaking(ctx, rec.ID); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
