package benchkit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// StormWave is one storm: Width clients at once, each creating a sandbox
// and running `true` in it. Latency is each client's, from the wave's
// start to its exec's answer, retries included.
type StormWave struct {
	Width int `json:"width"`
	// Seconds is the wave's wall time; PerSecond is Width over it.
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	Latency   *Stats  `json:"latency,omitempty"`
	// Deferred counts the creates the daemon deferred (503 Unavailable:
	// the memory floor or the overcommit cap) and that were retried;
	// Retried the clients that met at least one. Failed clients got any
	// other error, or no answer by the deadline; FirstError is one of them.
	Deferred   int    `json:"deferred"`
	Retried    int    `json:"retried"`
	Failed     int    `json:"failed"`
	FirstError string `json:"first_error,omitempty"`
}

// stormRetry is the wait before a deferred create is retried, and
// stormDeadline how long a client keeps retrying.
const (
	stormRetry    = 200 * time.Millisecond
	stormDeadline = 5 * time.Minute
)

// phaseStorm sends each of StormWidths concurrent creates-plus-exec at
// once through the API and records throughput, latency percentiles,
// failures and admission deferrals. Sandboxes have DensityMemoryMiB (the
// smallest limit) so that a wide wave fits the host's admission; every
// wave's sandboxes are removed before the next. No baseline.
func (r *runner) phaseStorm(ctx context.Context, ph *Phase) {
	t := r.clade
	for _, width := range r.cfg.StormWidths {
		if ctx.Err() != nil {
			break
		}
		r.settle(ctx)
		w := StormWave{Width: width}
		var (
			mu   sync.Mutex
			lats []time.Duration
			wg   sync.WaitGroup
		)
		start := time.Now()
		for range width {
			wg.Go(func() {
				deferred, err := r.stormClient(ctx, t)
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				w.Deferred += deferred
				if deferred > 0 {
					w.Retried++
				}
				if err != nil {
					w.Failed++
					if w.FirstError == "" {
						w.FirstError = err.Error()
					}
					return
				}
				lats = append(lats, d)
			})
		}
		wg.Wait()
		w.Seconds = round3(time.Since(start).Seconds())
		w.PerSecond = round3(float64(width-w.Failed) / time.Since(start).Seconds())
		w.Latency = Summarize(lats)
		ph.Storm = append(ph.Storm, w)
		r.prog.Log("storm %d: %.1fs, %d failed, %d deferred", width, w.Seconds, w.Failed, w.Deferred)
		r.prog.Update("storm %d: removing", width)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		err := t.cleanup(cctx)
		cancel()
		if err != nil {
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("storm %d: cleanup: %v", width, err))
			return
		}
		if w.Failed > 0 {
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("storm %d: %d of %d failed, first: %s", width, w.Failed, width, w.FirstError))
		}
	}
}

// stormClient creates one sandbox, retrying while the daemon defers it,
// and runs `true` in it; it returns how many times it was deferred.
func (r *runner) stormClient(ctx context.Context, t *cladeTarget) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, stormDeadline)
	defer cancel()
	deferred := 0
	name := t.name()
	for {
		sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: name, Image: t.image, MemoryMiB: r.cfg.DensityMemoryMiB, Engine: t.engine})
		if err == nil {
			t.add("sandbox", sb.ID)
			return deferred, t.exec(ctx, sb.ID)
		}
		if !sdk.IsUnavailable(err) && !sdk.IsResourceExhausted(err) {
			return deferred, fmt.Errorf("create: %w", err)
		}
		deferred++
		select {
		case <-ctx.Done():
			return deferred, errors.Join(fmt.Errorf("create: deferred %d times: %w", deferred, err), ctx.Err())
		case <-time.After(stormRetry):
		}
	}
}
