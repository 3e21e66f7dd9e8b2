package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/clade-sandbox/clade/internal/front/httpapi"
)

func TestRequireTokensPeerOnly(t *testing.T) {
	// Each handler answers 200 and says whether it saw a peer.
	open := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if httpapi.IsClusterPeer(r.Context()) {
			w.Header().Set("X-Peer", "1")
		}
	})
	for _, tc := range []struct {
		name              string
		api, cluster      string
		auth              string
		wantOpen, wantInt int
		peer              bool
	}{
		{"api token, tokens apart", "user", "nodes", "Bearer user", 200, 401, false},
		{"cluster token, tokens apart", "user", "nodes", "Bearer nodes", 200, 200, true},
		{"cluster token, lower-case scheme", "user", "nodes", "bearer nodes", 200, 200, true},
		{"wrong token", "user", "nodes", "Bearer nope", 401, 401, false},
		{"no token", "user", "nodes", "", 401, 401, false},
		{"prefix of the cluster token", "user", "nodes", "Bearer node", 401, 401, false},
		{"no cluster token: api token is no peer", "user", "", "Bearer user", 200, 401, false},
		{"no cluster token: empty bearer refused", "user", "", "Bearer ", 401, 401, false},
		{"one token for both: its holder is a peer", "same", "same", "Bearer same", 200, 200, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range []struct {
				h    http.Handler
				want int
			}{{httpapi.RequireTokens(tc.api, tc.cluster, open), tc.wantOpen},
				{httpapi.RequireTokens(tc.api, tc.cluster, httpapi.PeerOnly(open)), tc.wantInt}} {
				r := httptest.NewRequest(http.MethodGet, "/v1/health", nil)
				if tc.auth != "" {
					r.Header.Set("Authorization", tc.auth)
				}
				w := httptest.NewRecorder()
				h.h.ServeHTTP(w, r)
				if w.Code != h.want {
					t.Errorf("%d, want %d (%s)", w.Code, h.want, w.Body)
				}
				if w.Code == 200 && (w.Header().Get("X-Peer") == "1") != tc.peer {
					t.Errorf("peer %q, want %v", w.Header().Get("X-Peer"), tc.peer)
				}
			}
		})
	}
	// The unix socket has no token and is never a peer.
	w := httptest.NewRecorder()
	httpapi.PeerOnly(open).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != 401 {
		t.Errorf("a request without RequireTokens reached a peer-only route: %d", w.Code)
	}
}
