package benchkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// hotWait bounds the wait for the daemon's hot pool to hold a sandbox
// before a claim sample.
const hotWait = 2 * time.Minute

// phaseClaim: a create served by the daemon's hot pool (`--hot-pool N`):
// the CreateSandbox call alone, and until the sandbox answers an exec of
// true. Before each sample the harness waits until /v1/health reports a
// hot sandbox, so every sample is a claim; a daemon without a hot pool
// fails the phase instead of measuring cold creates. No baseline: plain
// runsc has nothing started ahead to claim.
func (r *runner) phaseClaim(ctx context.Context, ph *Phase) {
	t := r.clade
	h, err := t.c.Health(ctx)
	if err != nil {
		ph.Error = err.Error()
		return
	}
	if h.Hot == 0 && !r.waitHot(ctx) {
		ph.Error = "the daemon's hot pool stays empty: start the daemon with --hot-pool N (N >= 1) to measure claims"
		return
	}
	fn := func(ctx context.Context) ([]time.Duration, error) {
		if !r.waitHot(ctx) {
			return nil, fmt.Errorf("no hot sandbox within %s: the hot pool does not refill", hotWait)
		}
		start := time.Now()
		sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, Engine: t.engine})
		claim := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		t.add("sandbox", sb.ID)
		err = t.exec(ctx, sb.ID)
		ready := time.Since(start)
		return []time.Duration{claim, ready}, errors.Join(err, t.remove(ctx, sb.ID))
	}
	series, errs := r.measure(ctx, ph.Name, []string{"claim", "claim until exec"}, [2]sampleFunc{fn})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// waitHot polls the daemon's health until its hot pool holds a sandbox,
// then settles (the refill that started it is still winding down); false
// when none came within hotWait. The wait counts as settle time.
func (r *runner) waitHot(ctx context.Context) bool {
	start := time.Now()
	deadline := start.Add(hotWait)
	for {
		h, err := r.c.Health(ctx)
		if err == nil && h.Hot > 0 {
			break
		}
		if time.Now().After(deadline) {
			r.settled += time.Since(start)
			return false
		}
		select {
		case <-ctx.Done():
			r.settled += time.Since(start)
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	r.settled += time.Since(start)
	r.settle(ctx)
	return true
}
