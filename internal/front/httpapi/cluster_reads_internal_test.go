package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/prometheus/client_golang/prometheus"
)

// refusingReads is a ClusterReads that fails the test if a request gets
// to it: the requests below must be refused before.
type refusingReads struct{ t *testing.T }

func (r refusingReads) SubscribeEvents(context.Context, api.Positions, bool, service.EventFilter) (service.Subscription, api.Positions, error) {
	r.t.Error("SubscribeEvents reached")
	return nil, nil, context.Canceled
}

func (r refusingReads) EventsSince(context.Context, api.Positions, service.EventFilter) ([]api.Event, error) {
	r.t.Error("EventsSince reached")
	return nil, context.Canceled
}

func (r refusingReads) ListStats(context.Context, []string, map[string]string) ([]api.SandboxStats, error) {
	r.t.Error("ListStats reached")
	return nil, context.Canceled
}

// TestClusterQueriesRefused: the merged events' and stats' query values a
// node cannot use are 400s that say what to give, on a node of a cluster
// and on one outside (where a position per node means nothing).
func TestClusterQueriesRefused(t *testing.T) {
	for _, tc := range []struct {
		cluster bool
		path    string
		says    string
	}{
		{true, "/v1/events?cluster=true&since=5", "position per node"},
		{true, "/v1/events?cluster=true&since=n1:5,n1:6", "named twice"},
		{true, "/v1/events?cluster=true&since=n1:x", "not a whole number"},
		{true, "/v1/events?cluster=maybe", "true or false"},
		{true, "/v1/events?since=n1:5", "whole number"}, // positions are cluster=true's
		{true, "/v1/stats?cluster=maybe", "true or false"},
		{false, "/v1/events?cluster=true&since=n1:5", "not part of a cluster"},
		{false, "/v1/stats?cluster=2", "true or false"},
	} {
		cfg := Config{}
		if tc.cluster {
			cfg.Cluster = refusingReads{t}
		}
		s := New(cfg, nil, prometheus.NewRegistry())
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.says) {
			t.Errorf("%s (cluster %v): %d %s, want 400 saying %q", tc.path, tc.cluster, w.Code, strings.TrimSpace(w.Body.String()), tc.says)
		}
	}
	// The nodes' own routes, which the merge reads, are the nodes' only.
	s := New(Config{Cluster: refusingReads{t}}, nil, prometheus.NewRegistry())
	for _, p := range []string{"/v1/internal/events", "/v1/internal/stats"} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, p, nil))
		if w.Code != http.StatusUnauthorized {
			t.Errorf("%s without the cluster token: %d, want 401", p, w.Code)
		}
	}
}
