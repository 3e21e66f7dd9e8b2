package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// BenchmarkSnapshot times snapshot (leave running), fork at several widths
// until every child answers an exec, and sleep -> wake until it answers.
// `clade bench --baseline` runs the same phases next to plain runsc.
func BenchmarkSnapshot(b *testing.B) {
	args := []string{"--warm-pool", "16"}
	if p := os.Getenv("CLADE_BENCH_RESTORE_PARALLEL"); p != "" {
		args = append(args, "--restore-parallel", p)
	}
	d := testenv.StartDaemon(b, args...)
	c := d.Client
	ctx := context.Background()
	parent, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256})
	if err != nil {
		b.Fatal(err)
	}
	answer := func(id string) {
		if st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || st.Code != 0 {
			b.Fatal(err, st)
		}
	}
	b.Run("snapshot", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			start := time.Now()
			snap, err := c.SnapshotSandbox(ctx, parent.ID, "")
			if err != nil {
				b.Fatal(err)
			}
			samples = append(samples, time.Since(start))
			b.StopTimer()
			_ = c.DeleteSnapshot(ctx, snap.ID)
			b.StartTimer()
		}
		report(b, samples)
	})
	snap, err := c.SnapshotSandbox(ctx, parent.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("fork-%d", n), func(b *testing.B) {
			var samples []time.Duration
			for b.Loop() {
				start := time.Now()
				res, err := c.Fork(ctx, snap.ID, n)
				if err != nil {
					b.Fatal(err)
				}
				done := make(chan string, n)
				for _, ch := range res.Children {
					if ch.Error != "" {
						b.Fatal(ch.Error)
					}
					go func() { answer(ch.ID); done <- ch.ID }()
				}
				for range n {
					<-done
				}
				samples = append(samples, time.Since(start))
				b.StopTimer()
				for _, ch := range res.Children {
					_ = c.DeleteSandbox(ctx, ch.ID)
				}
				waitWarm(b, c, n)
				b.StartTimer()
			}
			report(b, samples)
		})
	}
	b.Run("wake", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			b.StopTimer()
			if _, err := c.Sleep(ctx, parent.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			if _, err := c.Wake(ctx, parent.ID); err != nil {
				b.Fatal(err)
			}
			answer(parent.ID)
			samples = append(samples, time.Since(start))
		}
		report(b, samples)
	})
}

// waitWarm waits (bounded) until the daemon's warm pool holds n prepared
// sandboxes, so each fork sample starts from the steady state.
func waitWarm(b *testing.B, c *sdk.Client, n int) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := c.Health(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if h.Warm >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("warm pool stuck at %d, want %d", h.Warm, n)
		}
		time.Sleep(20 * time.Millisecond) // polling the pool's size, timer stopped
	}
}
