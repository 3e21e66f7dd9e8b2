package httpapi

import (
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts every API operation, its latency and its errors by class.
type metrics struct {
	ops     *prometheus.CounterVec
	errs    *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clade_operations_total", Help: "API operations handled, by operation.",
		}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clade_operation_errors_total", Help: "API operations that failed, by operation and error class.",
		}, []string{"op", "class"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "clade_operation_duration_seconds", Help: "API operation latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"op"}),
	}
	reg.MustRegister(m.ops, m.errs, m.latency)
	return m
}

func (m *metrics) observe(op string, err error, d time.Duration) {
	m.ops.WithLabelValues(op).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.errs.WithLabelValues(op, string(errdefs.ClassOf(err))).Inc()
	}
}
