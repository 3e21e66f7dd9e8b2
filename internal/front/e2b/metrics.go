package e2b

import (
	"context"
	"errors"
	"io"
	"maps"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostinfo"
	"github.com/clade-sandbox/clade/internal/service"
)

// The front keeps E2B's metrics history: a ring of samples per sandbox,
// one every metricsEvery for metricsKeep, so that getMetrics({start, end})
// returns the samples in a range. It lives in the front, not the service:
// the history is E2B's (clade's own API reads use now, `clade stats`),
// and the front samples through service.Stats, which reads a sandbox from
// the host (the engine's cgroup), without waking it or counting as its
// use. Sampling from inside (an exec
// each 5 s) would keep every sandbox busy: idle sleep and the pressure
// relief's idle order would never see one idle.
const (
	metricsEvery = 5 * time.Second
	metricsKeep  = time.Hour
	metricsCap   = int(metricsKeep / metricsEvery)
)

// ring is one sandbox's history, and what it keeps between samples.
type ring struct {
	samples []metric // at most metricsCap, oldest first once full
	next    int      // where the next sample goes once full
	// The last host reading, for the CPU rate between two.
	cpuNanos uint64
	readAt   time.Time
	// The last disk use read inside the sandbox (getMetrics reads it):
	// the host does not see a sandbox's disk.
	diskUsed, diskTotal int64
}

func (r *ring) add(m metric) {
	if len(r.samples) < metricsCap {
		r.samples = append(r.samples, m)
		return
	}
	r.samples[r.next] = m
	r.next = (r.next + 1) % metricsCap
}

// between returns the samples from start to end (either zero: open),
// oldest first.
func (r *ring) between(start, end time.Time) []metric {
	out := []metric{}
	n := len(r.samples)
	for i := range n {
		m := r.samples[(r.next+i)%n]
		if !start.IsZero() && m.Timestamp.Before(start) || !end.IsZero() && m.Timestamp.After(end) {
			continue
		}
		out = append(out, m)
	}
	return out
}

type metricsRings struct {
	mu    sync.Mutex
	rings map[string]*ring
}

// watch starts sandbox id's ring, if it has none: the front samples the
// sandboxes E2B clients made or asked about (create, connect, getInfo,
// getMetrics...), not every sandbox of the node, since a host reading
// costs the engine a look at the sandbox (gVisor: a runsc ps).
func (s *Server) watch(id string) {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	if s.hist.rings[id] == nil {
		s.hist.rings[id] = &ring{}
	}
}

// sampleAll takes one host sample of every watched sandbox that runs, and
// drops the rings of sandboxes that are gone.
func (s *Server) sampleAll(ctx context.Context) error {
	s.hist.mu.Lock()
	ids := slices.Collect(maps.Keys(s.hist.rings))
	s.hist.mu.Unlock()
	var errs []error
	// The history has no use for the process count, which costs the
	// gVisor engine a `runsc ps` per sandbox and sample (~50 ms of CPU:
	// 20 sandboxes took a fifth of a core, docs/benchmarks.md).
	ctx = service.WithoutPids(ctx)
	for _, id := range ids {
		st, err := s.svc.Stats(ctx, id)
		if errdefs.IsNotFound(err) {
			s.forgetMetrics(id)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st.State != stateRunning {
			continue
		}
		s.hist.mu.Lock()
		r := s.hist.rings[id]
		fresh := r != nil && r.readAt.IsZero() && len(r.samples) == 0
		if r != nil {
			r.record(st)
		}
		s.hist.mu.Unlock()
		if fresh {
			go s.readDisk(id)
		}
	}
	return errors.Join(errs...)
}

// record adds a sample made of host reading st to the ring. The first
// reading after a (re)start only sets the CPU base.
func (r *ring) record(st api.SandboxStats) {
	cpus := st.CPUs
	if cpus <= 0 {
		cpus = float64(runtime.NumCPU())
	}
	m := metric{Timestamp: st.ReadAt.UTC(), CPUCount: int(math.Ceil(cpus)), MemUsed: int64(st.MemoryBytes),
		MemTotal: int64(st.MemoryLimitBytes), DiskUsed: r.diskUsed, DiskTotal: r.diskTotal}
	if m.MemTotal == 0 {
		if mib, err := hostinfo.MemTotalMiB(); err == nil {
			m.MemTotal = mib << 20
		}
	}
	restarted := r.readAt.IsZero() || st.CPUNanos < r.cpuNanos || !st.ReadAt.After(r.readAt)
	if !restarted {
		wall := st.ReadAt.Sub(r.readAt).Seconds() * cpus * 1e9
		m.CPUUsedPct = min(100, 100*float64(st.CPUNanos-r.cpuNanos)/wall)
	}
	r.cpuNanos, r.readAt = st.CPUNanos, st.ReadAt
	if !restarted {
		r.add(m)
	}
}

// sampleLoop samples every metricsEvery until ctx ends.
func (s *Server) sampleLoop(ctx context.Context) {
	t := time.NewTicker(metricsEvery)
	defer t.Stop()
	failing := false
	for {
		if err := s.sampleAll(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				s.log.Warn("e2b: sampling sandboxes' metrics failed (getMetrics answers one sample taken now)", "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// history returns sandbox id's samples from start to end, after noting
// disk, the disk use read inside it now (nil: none).
func (s *Server) history(id string, disk *metric, start, end time.Time) ([]metric, bool) {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	r := s.hist.rings[id]
	if r == nil {
		return nil, false
	}
	if disk != nil {
		r.diskUsed, r.diskTotal = disk.DiskUsed, disk.DiskTotal
	}
	return r.between(start, end), true
}

// forgetMetrics drops a removed sandbox's ring at once.
func (s *Server) forgetMetrics(id string) {
	s.hist.mu.Lock()
	delete(s.hist.rings, id)
	s.hist.mu.Unlock()
}

// diskScript prints the root file system's size and use in KiB.
const diskScript = `df -kP / | tail -n1`

// readDisk reads a running sandbox's disk use from inside it, once when
// its ring starts (getMetrics reads it again each call): what the host
// samples cannot see. A sandbox that is not running is left alone.
func (s *Server) readDisk(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := s.svc.Exec(ctx, id, service.NoWake, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", diskScript}})
	if err != nil {
		return
	}
	defer p.Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	out, _ := io.ReadAll(io.LimitReader(p.Stdout(), 4096))
	if exit, err := p.Wait(ctx); err != nil || exit.Code != 0 {
		return
	}
	var m metric
	parseDisk(string(out), &m)
	if sb, err := s.svc.Get(ctx, id); err == nil && sb.DiskMiB > 0 {
		m.DiskTotal = int64(sb.DiskMiB) << 20
	}
	s.history(id, &m, time.Time{}, time.Time{})
}

// parseDisk reads df -kP's line for / into m's disk fields.
func parseDisk(line string, m *metric) {
	if f := strings.Fields(line); len(f) >= 3 {
		total, _ := strconv.ParseInt(f[1], 10, 64)
		used, _ := strconv.ParseInt(f[2], 10, 64)
		m.DiskTotal, m.DiskUsed = total<<10, used<<10
	}
}

// hostSample is a sample of sb from the host's reading (memory, CPUs; the
// disk as last read inside), for a sandbox whose own sample failed with
// why; why itself when the host has no reading either.
func (s *Server) hostSample(ctx context.Context, sb api.Sandbox, why error) (metric, error) {
	if errdefs.IsNotFound(why) || ctx.Err() != nil {
		return metric{}, why
	}
	st, err := s.svc.Stats(ctx, sb.ID)
	if err != nil || st.State != stateRunning || st.ReadAt.IsZero() {
		return metric{}, why
	}
	cpus := st.CPUs
	if cpus <= 0 {
		cpus = float64(runtime.NumCPU())
	}
	m := metric{Timestamp: st.ReadAt.UTC(), CPUCount: int(math.Ceil(cpus)), MemUsed: int64(st.MemoryBytes), MemTotal: int64(st.MemoryLimitBytes)}
	if m.MemTotal == 0 {
		if mib, err := hostinfo.MemTotalMiB(); err == nil {
			m.MemTotal = mib << 20
		}
	}
	s.hist.mu.Lock()
	if r := s.hist.rings[sb.ID]; r != nil {
		m.DiskUsed, m.DiskTotal = r.diskUsed, r.diskTotal
	}
	s.hist.mu.Unlock()
	if sb.DiskMiB > 0 {
		m.DiskTotal = int64(sb.DiskMiB) << 20
	}
	s.log.Debug("e2b: getMetrics answers the host's reading: the sample inside failed", "sandbox", sb.ID, "err", why)
	return m, nil
}
