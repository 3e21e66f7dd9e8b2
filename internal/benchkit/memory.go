package benchkit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/clade-sandbox/clade/internal/hostinfo"
)

// phaseMemfork forks K children of one snapshot of a sandbox holding
// touched memory and reports what they cost the host. The sides run one
// after the other, each cleaned up before the next, so neither sees the
// other's memory.
func (r *runner) phaseMemfork(ctx context.Context, ph *Phase) {
	k := r.cfg.memforkChildren()
	m := &Memfork{Children: k, HeldMiB: r.cfg.MemforkMiB}
	ph.Memfork = m
	var errs [2]error
	for i, t := range r.targets() {
		if t == nil {
			continue
		}
		r.prog.Update("memfork: %s, %d children", t.side(), k)
		ms, err := r.memfork(ctx, t, k)
		if i == 0 {
			m.Clade = ms
		} else {
			m.Baseline = ms
		}
		if err != nil {
			errs[i] = err
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		errs[i] = errors.Join(errs[i], t.cleanup(cctx))
		cancel()
	}
	ph.record(errs)
	if m.Clade != nil && m.Baseline != nil {
		if m.Baseline.AvailPerChildMiB > 0 {
			m.AvailRatio = ratio(m.Clade.AvailPerChildMiB, m.Baseline.AvailPerChildMiB)
		}
		if m.Baseline.PSSPerChildMiB > 0 {
			m.PSSRatio = ratio(m.Clade.PSSPerChildMiB, m.Baseline.PSSPerChildMiB)
		}
		if m.Baseline.CgroupPerChildMiB > 0 {
			m.CgroupRatio = ratio(m.Clade.CgroupPerChildMiB, m.Baseline.CgroupPerChildMiB)
		}
	}
}

func (r *runner) memfork(ctx context.Context, t target, k int) (*MemStats, error) {
	id, err := t.createHolding(ctx, r.cfg.MemforkMiB)
	if err != nil {
		return nil, err
	}
	snap, err := t.snapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	parent := pssMiB(processesOf([]string{id}))
	r.settle(ctx) // the daemon's background work first, so it is not in the delta
	before, err := memAvailableMiB()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ids, err := t.fork(ctx, snap, k)
	forkMS := round3(float64(time.Since(start)) / float64(time.Millisecond))
	if err != nil {
		return nil, err
	}
	after, err := memAvailableMiB()
	if err != nil {
		return nil, err
	}
	pids := processesOf(ids)
	if len(pids) == 0 {
		return nil, errors.New("no host process mentions the children's ids: is the daemon on another host?")
	}
	cg, err := cgroupMiB(ids, pids)
	if errors.Is(err, errSharedCgroup) {
		cg = 0 // not the children's alone: the table shows none
	} else if err != nil {
		return nil, err
	}
	return &MemStats{
		AvailPerChildMiB:  round3((before - after) / float64(k)),
		PSSPerChildMiB:    round3(pssMiB(pids) / float64(k)),
		CgroupPerChildMiB: round3(cg / float64(k)),
		ParentPSSMiB:      round3(parent),
		Processes:         len(pids),
		ForkMS:            forkMS,
	}, nil
}

// phaseDensity creates idle sandboxes one at a time toward Density,
// sampling MemAvailable every tenth of the way, and stops at the first
// failure: the count reached and that failure's cause are the result.
// Running out is the finding, so it does not fail the phase; reaching none
// does. It stops early, as a finding too, before MemAvailable drops under
// a floor, so the harness never drives the host into the OOM killer.
// clade only: a runsc baseline would double the memory it needs.
func (r *runner) phaseDensity(ctx context.Context, ph *Phase) {
	mem := r.cfg.DensityMemoryMiB
	t := &cladeTarget{c: r.c, image: r.cfg.Image, memoryMiB: mem, prefix: r.clade.prefix + "-d"}
	d := &Density{Target: r.cfg.Density, MemoryMiB: mem}
	ph.Density = d
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		defer cancel()
		r.prog.Update("density: removing %d sandboxes", d.Reached)
		start := time.Now()
		if err := t.cleanup(cctx); err != nil {
			ph.Error = joinMsg(ph.Error, "cleanup: "+err.Error())
		}
		d.RemoveSeconds = round3(time.Since(start).Seconds())
	}()

	m, err := meminfo()
	if err != nil {
		ph.Error = err.Error()
		return
	}
	floor := max(1024, float64(m["MemTotal"])/1024/20) // MiB: 1 GiB or 5%
	start := time.Now()
	step := func(n int) (float64, error) {
		a, err := memAvailableMiB()
		if err == nil {
			d.Steps = append(d.Steps, DensityStep{Sandboxes: n, MemAvailableMiB: round3(a), Seconds: round3(time.Since(start).Seconds())})
		}
		return a, err
	}
	avail0, err := step(0)
	if err != nil {
		ph.Error = err.Error()
		return
	}
	every := max(1, d.Target/10)
	var creates []time.Duration
	for d.Reached < d.Target {
		if ctx.Err() != nil {
			d.StopCause = "interrupted"
			break
		}
		if a, err := memAvailableMiB(); err == nil && a < floor {
			d.StopCause = fmt.Sprintf("harness floor: MemAvailable %.0f MiB is under %.0f MiB", a, floor)
			break
		}
		cstart := time.Now()
		_, err := t.create(ctx)
		if err != nil {
			d.StopCause = err.Error()
			break
		}
		creates = append(creates, time.Since(cstart))
		d.Reached++
		if d.Reached%every == 0 {
			_, _ = step(d.Reached)
		}
		r.prog.Update("density %d/%d", d.Reached, d.Target)
	}
	if n := len(d.Steps); d.Steps[n-1].Sandboxes != d.Reached {
		_, _ = step(d.Reached)
	}
	d.Create = Summarize(creates)
	if d.Reached > 0 && ctx.Err() == nil {
		idleCPU(ctx, d, r.cfg.DensityIdle)
	}
	if d.Reached > 0 {
		d.PerSandboxMiB = round3((avail0 - d.Steps[len(d.Steps)-1].MemAvailableMiB) / float64(d.Reached))
	} else {
		ph.Error = "no sandbox started: " + d.StopCause
	}
}

// idleCPU measures the host's busy CPU while d's sandboxes sit idle: for
// idle (Config.DensityIdle), after half as long for the last creates'
// work (the pools' refills) to end.
func idleCPU(ctx context.Context, d *Density, idle time.Duration) {
	if idle <= 0 {
		idle = 10 * time.Second
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(idle / 2):
	}
	b0, t0, err := hostinfo.ReadCPUTimes()
	if err != nil {
		return
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(idle):
	}
	b1, t1, err := hostinfo.ReadCPUTimes()
	if err != nil || t1 <= t0 {
		return
	}
	frac := float64(b1-b0) / float64(t1-t0)
	d.IdleCPUPercent = round3(100 * frac)
	d.IdleCPUs = round3(frac * float64(runtime.NumCPU()))
	d.IdleSeconds = round3(time.Since(start).Seconds())
}
