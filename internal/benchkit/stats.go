package benchkit

import (
	"math"
	"slices"
	"time"
)

// Stats summarises one series of latency samples, in milliseconds.
type Stats struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_ms"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	// Samples are the measured values in the order they were taken, so a
	// reader can recompute anything else.
	Samples []float64 `json:"samples_ms"`
}

// Summarize computes Stats of samples; it returns nil for no samples.
func Summarize(samples []time.Duration) *Stats {
	if len(samples) == 0 {
		return nil
	}
	ms := make([]float64, len(samples))
	var sum float64
	for i, d := range samples {
		ms[i] = round3(float64(d) / float64(time.Millisecond))
		sum += ms[i]
	}
	sorted := slices.Clone(ms)
	slices.Sort(sorted)
	return &Stats{
		N:       len(ms),
		Min:     sorted[0],
		Mean:    round3(sum / float64(len(ms))),
		P50:     Percentile(sorted, 0.50),
		P90:     Percentile(sorted, 0.90),
		P99:     Percentile(sorted, 0.99),
		Max:     sorted[len(sorted)-1],
		Samples: ms,
	}
}

// Percentile returns the p-quantile (0 <= p <= 1) of sorted values,
// interpolating linearly between the two closest ranks (numpy's default,
// Hyndman-Fan type 7): the median of an even count is the mean of the two
// middle values, and one sample is every percentile. It returns 0 for no
// values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	h := p * float64(len(sorted)-1)
	lo := int(math.Floor(h))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return round3(sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo]))
}

// Ratio is clade's figure divided by the baseline's, per percentile: below
// 1 clade is faster.
type Ratio struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Ratios returns clade/baseline per percentile, or nil when either side is
// missing or a baseline figure is zero (no meaningful ratio).
func Ratios(clade, baseline *Stats) *Ratio {
	if clade == nil || baseline == nil || baseline.P50 <= 0 || baseline.P90 <= 0 || baseline.P99 <= 0 || baseline.Max <= 0 {
		return nil
	}
	return &Ratio{
		P50: ratio(clade.P50, baseline.P50),
		P90: ratio(clade.P90, baseline.P90),
		P99: ratio(clade.P99, baseline.P99),
		Max: ratio(clade.Max, baseline.Max),
	}
}

func ratio(a, b float64) float64 { return round3(a / b) }

// round3 keeps JSON short: microsecond resolution is all a wall clock
// around an HTTP call or a runsc process can claim.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
