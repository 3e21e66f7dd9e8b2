package benchkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// sampleFunc takes one sample: one duration per series of its phase.
type sampleFunc func(ctx context.Context) ([]time.Duration, error)

// measure takes Warmup+Samples rounds of one clade sample then one
// baseline sample and keeps the last Samples of each. Alternating puts both
// sides under the same machine state (page cache, other load, thermal) as
// it drifts through the run. A side stops at its first failure; the other
// goes on. A nil sampleFunc is a side that is absent or failed its setup.
func (r *runner) measure(ctx context.Context, label string, names []string, fns [2]sampleFunc) ([]Series, [2]error) {
	var (
		got  [2][][]time.Duration // side, series, sample
		errs [2]error
		last [2]time.Duration
	)
	for s := range got {
		got[s] = make([][]time.Duration, len(names))
	}
	rounds := r.cfg.Warmup + r.cfg.Samples
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		for s, fn := range fns {
			if fn == nil || errs[s] != nil {
				continue
			}
			r.settle(ctx)
			sctx, cancel := context.WithTimeout(ctx, r.cfg.SampleTimeout)
			ds, err := fn(sctx)
			cancel()
			if err != nil {
				errs[s] = fmt.Errorf("%s, sample %d: %w", label, i+1, err)
				continue
			}
			last[s] = ds[0]
			if i >= r.cfg.Warmup {
				for j := range names {
					got[s][j] = append(got[s][j], ds[j])
				}
			}
		}
		r.prog.Update("%s %d/%d%s", label, i+1, rounds, lastSamples(fns, last))
	}
	if err := ctx.Err(); err != nil {
		for s, fn := range fns {
			if fn != nil && errs[s] == nil {
				errs[s] = fmt.Errorf("%s: %w", label, err)
			}
		}
	}
	series := make([]Series, len(names))
	for j, name := range names {
		series[j] = Series{Name: name, Clade: Summarize(got[0][j]), Baseline: Summarize(got[1][j])}
		series[j].Ratio = Ratios(series[j].Clade, series[j].Baseline)
	}
	return series, errs
}

func lastSamples(fns [2]sampleFunc, last [2]time.Duration) string {
	s := ""
	for i, side := range []string{"clade", "runsc"} {
		if fns[i] != nil && last[i] > 0 {
			s += fmt.Sprintf("  %s %.1f ms", side, float64(last[i])/float64(time.Millisecond))
		}
	}
	return s
}

// setup runs f on each present side and returns the sample functions of
// the sides that succeeded and the errors of those that did not.
func (r *runner) setup(f func(t target) (sampleFunc, error)) ([2]sampleFunc, [2]error) {
	var fns [2]sampleFunc
	var errs [2]error
	for i, t := range r.targets() {
		if t == nil {
			continue
		}
		fn, err := f(t)
		if err != nil {
			errs[i] = fmt.Errorf("setup: %w", err)
			continue
		}
		fns[i] = fn
	}
	return fns, errs
}

// latency is a phase with one setup and one measure.
func (r *runner) latency(ctx context.Context, ph *Phase, names []string, f func(t target) (sampleFunc, error)) {
	fns, errs := r.setup(f)
	ph.record(errs)
	series, errs := r.measure(ctx, ph.Name, names, fns)
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// phaseCreate: the create call until the sandbox answers an exec of true.
func (r *runner) phaseCreate(ctx context.Context, ph *Phase) {
	r.latency(ctx, ph, []string{"create"}, func(t target) (sampleFunc, error) {
		return func(ctx context.Context) ([]time.Duration, error) {
			start := time.Now()
			id, err := t.create(ctx)
			d := time.Since(start)
			if id != "" {
				err = errors.Join(err, t.remove(ctx, id))
			}
			return []time.Duration{d}, err
		}, nil
	})
}

// phaseExec: a round trip of `true` in a running sandbox; then, on clade
// alone, of a command the agent does not find (exit 127, no process
// started): the protocol's own cost, SDK to agent and back.
func (r *runner) phaseExec(ctx context.Context, ph *Phase) {
	var sandboxes [2]string
	r.latency(ctx, ph, []string{"exec"}, func(t target) (sampleFunc, error) {
		id, err := t.create(ctx)
		if err != nil {
			return nil, err
		}
		sandboxes[sideIndex(t)] = id
		return func(ctx context.Context) ([]time.Duration, error) {
			start := time.Now()
			err := t.exec(ctx, id)
			return []time.Duration{time.Since(start)}, err
		}, nil
	})
	if sandboxes[0] == "" {
		return
	}
	c, id := r.clade.c, sandboxes[0]
	series, errs := r.measure(ctx, "exec, no spawn", []string{"exec, no spawn"}, [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		start := time.Now()
		st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{NoSuchCommand}})
		d := time.Since(start)
		if err == nil && st.Code != 127 {
			err = fmt.Errorf("exec %s in %s: exit %d, want 127 (not found)", NoSuchCommand, id, st.Code)
		}
		return []time.Duration{d}, err
	}})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// NoSuchCommand is a command no image has: the agent answers 127 after
// its PATH search, with no process started (an exec's round trip
// without a spawn's milliseconds).
const NoSuchCommand = "clade-bench-no-such-command"

// phaseSnapshot: a checkpoint of an idle sandbox that keeps running.
func (r *runner) phaseSnapshot(ctx context.Context, ph *Phase) {
	r.latency(ctx, ph, []string{"snapshot"}, func(t target) (sampleFunc, error) {
		id, err := t.create(ctx)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) ([]time.Duration, error) {
			start := time.Now()
			snap, err := t.snapshot(ctx, id)
			d := time.Since(start)
			if snap != "" {
				err = errors.Join(err, t.removeSnapshot(ctx, snap))
			}
			return []time.Duration{d}, err
		}, nil
	})
}

// phaseFork: restore n children of one snapshot until every one answers an
// exec, for each fan-out width; per child is that wall time over n.
func (r *runner) phaseFork(ctx context.Context, ph *Phase) {
	var snaps [2]string
	_, errs := r.setup(func(t target) (sampleFunc, error) {
		id, err := t.create(ctx)
		if err != nil {
			return nil, err
		}
		snap, err := t.snapshot(ctx, id)
		snaps[sideIndex(t)] = snap
		return nil, err
	})
	ph.record(errs)
	for _, n := range r.cfg.Fanout {
		var fns [2]sampleFunc
		for i, t := range r.targets() {
			if t == nil || errs[i] != nil {
				continue
			}
			snap := snaps[i]
			fns[i] = func(ctx context.Context) ([]time.Duration, error) {
				start := time.Now()
				ids, err := t.fork(ctx, snap, n)
				d := time.Since(start)
				err = errors.Join(err, parallel(ids, 4, func(id string) error { return t.remove(ctx, id) }))
				return []time.Duration{d, d / time.Duration(n)}, err
			}
		}
		names := []string{fmt.Sprintf("fork %d", n), fmt.Sprintf("fork %d per child", n)}
		if n == 1 {
			names = names[:1] // per child is the same series
		}
		series, ferrs := r.measure(ctx, names[0], names, fns)
		ph.Latency = append(ph.Latency, series...)
		ph.record(ferrs)
	}
}

// phaseWake: sleep (snapshot to disk and stop), then wake until the
// sandbox answers an exec; both are series.
func (r *runner) phaseWake(ctx context.Context, ph *Phase) {
	r.latency(ctx, ph, []string{"sleep", "wake"}, func(t target) (sampleFunc, error) {
		id, err := t.create(ctx)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) ([]time.Duration, error) {
			start := time.Now()
			if err := t.sleep(ctx, id); err != nil {
				return nil, err
			}
			slept := time.Since(start)
			start = time.Now()
			err := t.wake(ctx, id)
			return []time.Duration{slept, time.Since(start)}, err
		}, nil
	})
}

func sideIndex(t target) int {
	if t.side() == "clade" {
		return 0
	}
	return 1
}

const (
	settleWindow = 100 * time.Millisecond
	// settleTicks is the CPU allowed in one window for "idle": one clock
	// tick, 10 ms at Linux's usual USER_HZ of 100.
	settleTicks = 1
)

// settle waits until the processes of the daemon's data dir and of the
// baseline's root used at most settleTicks of CPU over one window, or
// SettleMS passed. The daemon refills its warm pool of prepared sandboxes
// in the background after creates and forks; on a small host that work
// would land in the next sample, of whichever side comes next. Settling
// makes every sample the latency of one operation on a quiet host, which
// is also what a user whose requests are spaced out sees (a burst is what
// the fork phase measures).
func (r *runner) settle(ctx context.Context) {
	if r.cfg.SettleMS <= 0 {
		return
	}
	start := time.Now()
	defer func() { r.settled += time.Since(start) }()
	subs := []string{r.cfg.DataDir}
	if r.base != nil {
		subs = append(subs, r.base.dir)
	}
	deadline := start.Add(time.Duration(r.cfg.SettleMS) * time.Millisecond)
	tick := time.NewTicker(settleWindow)
	defer tick.Stop()
	prev := cpuTicks(subs)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cur := cpuTicks(subs)
		// A process that exited takes its ticks along: not idle either.
		if d := cur - prev; d >= 0 && d <= settleTicks {
			return
		}
		prev = cur
	}
}
