package e2b

import (
	"context"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/service"
)

// TestMetricsRing: the ring keeps the last hour of samples (a bounded
// number, oldest dropped first), returns a range oldest first, and turns
// two host readings into the CPU use between them as a share of the
// sandbox's CPUs; a reading after a restart (CPU time went back) only
// sets a new base.
func TestMetricsRing(t *testing.T) {
	r := &ring{diskUsed: 7, diskTotal: 9}
	t0 := time.Unix(1_800_000_000, 0)
	r.record(api.SandboxStats{ReadAt: t0, CPUNanos: 1e9, CPUs: 2, MemoryBytes: 100, MemoryLimitBytes: 1000})
	if len(r.samples) != 0 {
		t.Fatalf("the first reading made a sample: %+v", r.samples)
	}
	// 5 s of two CPUs is 10 CPU-seconds: 2.5 of them is 25%.
	r.record(api.SandboxStats{ReadAt: t0.Add(5 * time.Second), CPUNanos: 3.5e9, CPUs: 2, MemoryBytes: 200, MemoryLimitBytes: 1000})
	if len(r.samples) != 1 {
		t.Fatalf("samples %+v, want 1", r.samples)
	}
	m := r.samples[0]
	if m.CPUUsedPct != 25 || m.CPUCount != 2 || m.MemUsed != 200 || m.MemTotal != 1000 || m.DiskUsed != 7 || m.DiskTotal != 9 {
		t.Errorf("sample %+v, want 25%% of 2 CPUs, 200 of 1000 bytes, disk 7 of 9", m)
	}
	r.record(api.SandboxStats{ReadAt: t0.Add(10 * time.Second), CPUNanos: 1e6, CPUs: 2})
	if len(r.samples) != 1 {
		t.Errorf("a reading after a restart made a sample: %+v", r.samples)
	}
	r = &ring{}
	for i := range metricsCap + 10 {
		r.add(metric{Timestamp: t0.Add(time.Duration(i) * metricsEvery)})
	}
	if len(r.samples) != metricsCap {
		t.Fatalf("%d samples kept, want %d", len(r.samples), metricsCap)
	}
	all := r.between(time.Time{}, time.Time{})
	if len(all) != metricsCap || !all[0].Timestamp.Equal(t0.Add(10*metricsEvery)) || !all[len(all)-1].Timestamp.Equal(t0.Add(time.Duration(metricsCap+9)*metricsEvery)) {
		t.Fatalf("between(all): %d samples from %v to %v, want the last %d oldest first", len(all), all[0].Timestamp, all[len(all)-1].Timestamp, metricsCap)
	}
	for i := 1; i < len(all); i++ {
		if !all[i].Timestamp.After(all[i-1].Timestamp) {
			t.Fatalf("sample %d (%v) is not after %v", i, all[i].Timestamp, all[i-1].Timestamp)
		}
	}
	some := r.between(t0.Add(100*metricsEvery), t0.Add(102*metricsEvery))
	if len(some) != 3 || !some[0].Timestamp.Equal(t0.Add(100*metricsEvery)) {
		t.Errorf("between(100, 102): %+v, want the 3 samples 100 to 102", some)
	}
	if got := r.between(t0.Add(-time.Hour), t0); len(got) != 0 {
		t.Errorf("a range before the ring: %+v, want none", got)
	}
}

// statsOnly is a service whose Stats alone answers, recording whether a
// reading asked for the process count.
type statsOnly struct {
	service.Service
	pidsAsked []bool
}

func (s *statsOnly) Stats(ctx context.Context, ref string) (api.SandboxStats, error) {
	s.pidsAsked = append(s.pidsAsked, service.PidsWanted(ctx))
	return api.SandboxStats{ID: ref, State: stateSleeping}, nil
}

// TestMetricsSampleWithoutPids: the sampler's readings ask for no process
// count, which costs the gVisor engine a runsc process per sandbox and
// sample (20 sandboxes took a fifth of a core in BenchmarkMetricsRing).
func TestMetricsSampleWithoutPids(t *testing.T) {
	svc := &statsOnly{}
	s := &Server{svc: svc, hist: metricsRings{rings: map[string]*ring{"a": {}, "b": {}}}}
	if err := s.sampleAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(svc.pidsAsked) != 2 || svc.pidsAsked[0] || svc.pidsAsked[1] {
		t.Fatalf("readings asking for the process count: %v, want 2 that do not", svc.pidsAsked)
	}
}
