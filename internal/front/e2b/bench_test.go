package e2b_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// report adds p50/p99 of samples (ms) to b's output.
func report(b *testing.B, ms []float64) {
	if len(ms) == 0 {
		return
	}
	slices.Sort(ms)
	q := func(p float64) float64 { return ms[min(len(ms)-1, int(p*float64(len(ms))))] }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles are the figures
}

// BenchmarkE2BFront compares, on one daemon, commands.run('true') and
// Sandbox.create() through the E2B front (the real JS SDK, timed inside
// node) with the same work through clade's own API (the Go SDK). E2B's
// commands.run is `/bin/bash -l -c CMD`, so clade's is timed both bare and
// through the same login shell.
func BenchmarkE2BFront(b *testing.B) {
	dir := jsDir(b)
	d, url, key := startE2B(b)
	node := func(b *testing.B, op string) {
		cmd := exec.Command("node", "bench.mjs", op, strconv.Itoa(b.N))
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("node bench.mjs %s: %v", op, err)
		}
		var res struct{ MS []float64 }
		if err := json.Unmarshal(out, &res); err != nil {
			b.Fatalf("node bench.mjs %s: %v in %q", op, err, out)
		}
		report(b, res.MS)
	}
	ctx := context.Background()
	execLoop := func(b *testing.B, cmd []string) {
		sb, err := d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Client.DeleteSandbox(ctx, sb.ID)
		var ms []float64
		for b.Loop() {
			start := time.Now()
			st, err := d.Client.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: cmd})
			if err != nil || st.Code != 0 {
				b.Fatal(err, st)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		report(b, ms)
	}
	b.Run("run-true/clade-sdk", func(b *testing.B) { execLoop(b, []string{"true"}) })
	b.Run("run-true/clade-sdk-bash-l", func(b *testing.B) { execLoop(b, []string{"/bin/bash", "-l", "-c", "true"}) })
	b.Run("run-true/e2b-js", func(b *testing.B) { node(b, "run") })
	b.Run("create/clade-sdk", func(b *testing.B) {
		var ms []float64
		for b.Loop() {
			start := time.Now()
			sb, err := d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
			if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
		}
		report(b, ms)
	})
	b.Run("create/e2b-js", func(b *testing.B) { node(b, "create") })
}
