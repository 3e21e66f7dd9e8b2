package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clade-sandbox/clade/api"
)

// TestMalformedQueryRefused: a query string that does not parse is a 400
// before any handler runs. r.URL.Query() drops the pairs it cannot read,
// so ?label=a=b;c listed every sandbox (the filter gone) instead of none.
// The server has no manager here: a request that got past the check
// would panic into a 500.
func TestMalformedQueryRefused(t *testing.T) {
	s := New(Config{}, nil, prometheus.NewRegistry())
	for _, target := range []string{
		"/v1/sandboxes?label=%zz",
		"/v1/sandboxes?label=app=web;x",
		"/v1/stats?label=app%3Dweb&id=%",
		"/v1/events?sandbox=a%2",
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		var e api.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != http.StatusBadRequest || err != nil ||
			e.Code != "invalid_argument" || !strings.Contains(e.Message, "malformed query string") {
			t.Errorf("GET %s: %d %s, want 400 saying the query string is malformed", target, rec.Code, rec.Body)
		}
	}
	// A well-formed query gets past the check (to the missing manager).
	if err := CheckQuery(httptest.NewRequest(http.MethodGet, "/v1/sandboxes?label=app%3Dweb&label=a=b", nil)); err != nil {
		t.Errorf("a well-formed query refused: %v", err)
	}
}

// TestLabelFilterTwoValues: ?label=a=1&label=a=2 matches no sandbox (one
// value per key); keeping the last pair listed every a=2 sandbox.
func TestLabelFilterTwoValues(t *testing.T) {
	_, err := labelFilter(httptest.NewRequest(http.MethodGet, "/v1/sandboxes?label=a=1&label=a=2", nil))
	if err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("labelFilter(a=1, a=2) = %v; want an invalid_argument error", err)
	}
	want, err := labelFilter(httptest.NewRequest(http.MethodGet, "/v1/sandboxes?label=a=1&label=a=1&label=b=2", nil))
	if err != nil || len(want) != 2 {
		t.Fatalf("labelFilter(a=1, a=1, b=2) = %v, %v", want, err)
	}
	if _, err := parseEventsQuery(httptest.NewRequest(http.MethodGet, "/v1/events?label=a=1&label=a=2", nil)); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("parseEventsQuery(a=1, a=2) = %v; want an invalid_argument error", err)
	}
}
