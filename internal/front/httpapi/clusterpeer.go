package httpapi

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// A cluster's nodes call each other's API with the cluster token
// (--cluster-token-file), which may differ from the users' API token
// (--token-file). RequireTokens accepts either on the TCP listener and
// marks a request that came with the cluster token as a peer's; routes
// that only the cluster's nodes may call (internal ones: a cross-node
// fork's or move's steps) are registered with routePeer, or wrapped in
// PeerOnly, and refuse every other caller — the API token, and the unix
// socket, included.
//
// Without --cluster-token-file the cluster token is the API token: every
// holder of the API token is then a peer (the behaviour before the two
// were apart).

// clusterPeerKey marks a request's context as a peer node's.
type clusterPeerKey struct{}

// IsClusterPeer reports whether the request of ctx came with the cluster
// token: a node of this cluster made it.
func IsClusterPeer(ctx context.Context) bool {
	v, _ := ctx.Value(clusterPeerKey{}).(bool)
	return v
}

// RequireTokens wraps h so that every request must carry the API token or
// the cluster token as its bearer token; one with the cluster token is a
// peer's (IsClusterPeer). An empty clusterToken accepts the API token
// only, and no request is a peer's; a clusterToken equal to apiToken makes
// every request a peer's.
func RequireTokens(apiToken, clusterToken string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token: pass it as `Authorization: Bearer TOKEN` (the CLI reads CLADE_TOKEN)"))
			return
		}
		// Both compared, always: the time taken says nothing of which
		// one matched.
		isAPI := subtle.ConstantTimeCompare([]byte(tok), []byte(apiToken)) == 1
		isPeer := clusterToken != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(clusterToken)) == 1
		if !isAPI && !isPeer {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token: pass it as `Authorization: Bearer TOKEN` (the CLI reads CLADE_TOKEN)"))
			return
		}
		if isPeer {
			r = r.WithContext(context.WithValue(r.Context(), clusterPeerKey{}, true))
		}
		h.ServeHTTP(w, r)
	})
}

// errNotPeer refuses a caller of a route only the cluster's nodes call.
func errNotPeer() error {
	return errdefs.New(errdefs.Unauthenticated, "this route is for the nodes of a cluster: it needs the cluster token (--cluster-token-file), not the API token")
}

// PeerOnly wraps h so that only a peer node (a request RequireTokens
// marked) reaches it; any other caller gets a 401 that says so.
func PeerOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsClusterPeer(r.Context()) {
			writeError(w, errNotPeer())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// routePeer registers a route only the cluster's nodes may call (see
// PeerOnly), under /v1/internal/: like the routes of Config.Internal, it
// is not part of the public API (nor of Routes, the spec's list).
func (s *Server) routePeer(pattern, op string, h handlerFunc) {
	if _, p, _ := strings.Cut(pattern, " "); !strings.HasPrefix(p, "/v1/internal/") {
		panic("httpapi: peer-only route " + pattern + " is not under /v1/internal/")
	}
	s.handle(pattern, op, func(w http.ResponseWriter, r *http.Request) error {
		if !IsClusterPeer(r.Context()) {
			return errNotPeer()
		}
		return h(w, r)
	})
}
