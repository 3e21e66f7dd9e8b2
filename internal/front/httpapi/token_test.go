package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/clade-sandbox/clade/internal/front/httpapi"
)

func TestRequireToken(t *testing.T) {
	h := httpapi.RequireToken("s3cret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer s3cret", http.StatusOK},
		{"bearer s3cret", http.StatusOK}, // the scheme is case-insensitive
		{"BEARER s3cret", http.StatusOK},
		{"", http.StatusUnauthorized},
		{"Bearer", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Bearer s3cre", http.StatusUnauthorized},
		{"Basic s3cret", http.StatusUnauthorized},
		{"s3cret", http.StatusUnauthorized},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/health", nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, w.Code, tc.want)
		}
	}
}
