package benchkit

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	seq := func(n int) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = float64(i + 1)
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 0.5, 0},
		{"one sample p50", []float64{7}, 0.5, 7},
		{"one sample p99", []float64{7}, 0.99, 7},
		{"two samples p50 is their mean", []float64{1, 2}, 0.5, 1.5},
		{"even count p50", []float64{1, 2, 3, 4}, 0.5, 2.5},
		{"odd count p50", []float64{1, 2, 3}, 0.5, 2},
		{"p0 is min", []float64{3, 4, 9}, 0, 3},
		{"p100 is max", []float64{3, 4, 9}, 1, 9},
		{"p90 of 1..10 interpolates", seq(10), 0.9, 9.1},
		{"p99 of 1..100", seq(100), 0.99, 99.01},
		{"p99 of 1..30 near max", seq(30), 0.99, 29.71},
		{"duplicates", []float64{5, 5, 5, 5}, 0.9, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	if s := Summarize(nil); s != nil {
		t.Errorf("Summarize(nil) = %+v, want nil", s)
	}
	ms := time.Millisecond
	s := Summarize([]time.Duration{3 * ms, 1 * ms, 2 * ms, 4 * ms})
	want := Stats{N: 4, Min: 1, Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4, Samples: []float64{3, 1, 2, 4}}
	if s.N != want.N || s.Min != want.Min || s.Mean != want.Mean || s.P50 != want.P50 || s.P90 != want.P90 ||
		s.P99 != want.P99 || s.Max != want.Max || !slices.Equal(s.Samples, want.Samples) {
		t.Errorf("Summarize = %+v, want %+v (samples in the order taken)", *s, want)
	}
	one := Summarize([]time.Duration{1500 * time.Microsecond})
	if one.P50 != 1.5 || one.P99 != 1.5 || one.Max != 1.5 || one.Min != 1.5 {
		t.Errorf("one sample: %+v, want every figure 1.5", *one)
	}
}

func TestRatios(t *testing.T) {
	clade := &Stats{P50: 10, P90: 20, P99: 30, Max: 40}
	base := &Stats{P50: 5, P90: 40, P99: 30, Max: 80}
	r := Ratios(clade, base)
	if r == nil || *r != (Ratio{P50: 2, P90: 0.5, P99: 1, Max: 0.5}) {
		t.Errorf("Ratios = %+v, want {2 0.5 1 0.5}", r)
	}
	if r := Ratios(&Stats{P50: 1, P90: 1, P99: 1, Max: 1}, &Stats{P50: 3, P90: 3, P99: 3, Max: 3}); r.P50 != 0.333 {
		t.Errorf("1/3 = %v, want 0.333 (rounded)", r.P50)
	}
	for name, tc := range map[string][2]*Stats{
		"no baseline":   {clade, nil},
		"no clade":      {nil, base},
		"zero baseline": {clade, {P50: 0, P90: 1, P99: 1, Max: 1}},
	} {
		if r := Ratios(tc[0], tc[1]); r != nil {
			t.Errorf("%s: Ratios = %+v, want nil", name, r)
		}
	}
}

func TestMemforkChildren(t *testing.T) {
	for _, tc := range []struct {
		fanout   []int
		explicit int
		want     int
	}{
		{[]int{1, 4, 16, 64}, 0, 16},
		{[]int{64, 4}, 0, 4},
		{[]int{32, 64}, 0, 32}, // none <= 16: the smallest
		{[]int{1, 4}, 0, 4},
		{[]int{1, 4, 16}, 3, 3},
	} {
		cfg := Config{Fanout: tc.fanout, MemforkChildren: tc.explicit}
		if got := cfg.memforkChildren(); got != tc.want {
			t.Errorf("fanout %v, explicit %d: %d children, want %d", tc.fanout, tc.explicit, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	enc := DefaultConfig()
	enc.Phases, enc.EncryptedHost = []string{"encryption"}, "/tmp/enc.sock"
	if err := enc.Validate(); err != nil || enc.Phases[0] != "atrest" {
		t.Fatalf("the encryption phase (atrest's other name): %v %v", enc.Phases, err)
	}
	for name, mod := range map[string]func(*Config){
		"unknown phase":     func(c *Config) { c.Phases = []string{"create", "nope"} },
		"no phases":         func(c *Config) { c.Phases = nil },
		"zero samples":      func(c *Config) { c.Samples = 0 },
		"negative warmup":   func(c *Config) { c.Warmup = -1 },
		"zero fan-out":      func(c *Config) { c.Fanout = []int{0, 4} },
		"fork without any":  func(c *Config) { c.Fanout = nil },
		"density of 0":      func(c *Config) { c.Density = 0 },
		"baseline no runsc": func(c *Config) { c.Baseline = true; c.Runsc = "" },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}
