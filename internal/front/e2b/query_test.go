package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestMalformedQueryRefused: Sandbox.list's ?metadata=... filter that
// does not parse is a 400, not dropped (which listed every sandbox). The
// front has no manager here: a request past the check would be a 500.
func TestMalformedQueryRefused(t *testing.T) {
	s, err := New(Config{APIKey: "k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for _, target := range []string{"/v2/sandboxes?metadata=%zz", "/sandboxes?metadata=who%3De2b;x", "/snapshots?limit=%"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Header.Set("X-API-Key", "k")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var e apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != http.StatusBadRequest || err != nil ||
			e.Code != 400 || !strings.Contains(e.Message, "malformed query string") {
			t.Errorf("GET %s: %d %s, want 400 saying the query string is malformed", target, rec.Code, rec.Body)
		}
	}
}
