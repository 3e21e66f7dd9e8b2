package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkClaim is the store's part of a hot-pool claim: the record
// written running as the pool mark is dropped, one transaction. It
// reports the median (p50-us): this disk is shared and its mean is noise.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(b.TempDir(), "clade.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	opts := Options{DiskMiB: 10240, Network: &NetworkOptions{Mode: "internet", Egress: "allow"}, TrafficToken: "0123456789abcdef0123456789abcdef"}
	n := 0
	b.Run("claim", func(b *testing.B) {
		var took []time.Duration
		for range b.N {
			n++
			id := fmt.Sprintf("%016x", n)
			if err := st.AddPoolSandbox(ctx, id); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			rec := Sandbox{ID: id, Image: "default", State: StateRunning, MemoryMiB: 512, CPUs: 1, RootFS: "/x/rootfs", Opts: opts, CreatedAt: time.Now()}
			if err := st.ClaimPoolSandbox(ctx, rec); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
		b.ReportMetric(0, "ns/op")
	})
}
