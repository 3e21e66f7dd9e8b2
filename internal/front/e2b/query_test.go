package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBadRequestsRefused: what the front refuses before it asks the
// manager. The front has no manager here: a request past the checks would
// be a 500. Sandbox.list's ?metadata=... filter that does not parse is a
// 400, not dropped (which listed every sandbox); a fork's count below 1 is
// said in E2B's terms.
func TestBadRequestsRefused(t *testing.T) {
	s, err := New(Config{APIKey: "k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for _, tc := range []struct{ method, target, body, says string }{
		{"GET", "/v2/sandboxes?metadata=%zz", "", "malformed query string"},
		{"GET", "/sandboxes?metadata=who%3De2b;x", "", "malformed query string"},
		{"GET", "/snapshots?limit=%", "", "malformed query string"},
		{"POST", "/sandboxes/x/fork", `{"count":0}`, "count 0: give the number of children, 1 or more"},
		{"GET", "/v2/sandboxes?order=newest", "", `bad order "newest": use asc or desc`},
		{"GET", "/v2/sandboxes?startedAfter=yesterday", "", `bad startedAfter "yesterday": give an RFC 3339 time`},
		{"GET", "/v2/sandboxes?startedBefore=2026-13-01T00:00:00Z", "", `bad startedBefore "2026-13-01T00:00:00Z"`},
	} {
		req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
		req.Header.Set("X-API-Key", "k")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var e apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != http.StatusBadRequest || err != nil ||
			e.Code != 400 || !strings.Contains(e.Message, tc.says) {
			t.Errorf("%s %s %s: %d %s, want 400 saying %q", tc.method, tc.target, tc.body, rec.Code, rec.Body, tc.says)
		}
	}
}
