package ingress

import (
	"context"
	"net"
	"net/http"
)

// NewForwarder returns a proxy with no sandbox service whose handler
// serves every request from port 1 of sandbox "sb" in the life *life,
// reached with dial: the forwarder (or, with reverse, the upgrade way's
// reverse proxy) alone.
func NewForwarder(dial func(ctx context.Context) (net.Conn, error), life *int, reverse bool) (*Proxy, http.Handler) {
	return NewForwarderConfig(Config{}, dial, life, reverse)
}

// NewForwarderConfig is NewForwarder with the limits of cfg.
func NewForwarderConfig(cfg Config, dial func(ctx context.Context) (net.Conn, error), life *int, reverse bool) (*Proxy, http.Handler) {
	cfg.Domain = "test"
	p := New(cfg, nil)
	p.dialer = func(ctx context.Context, _ string, _ int) (net.Conn, error) { return dial(ctx) }
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		routed(r)
		rt := route{id: "sb", port: 1}
		r = r.WithContext(context.WithValue(r.Context(), routeKey{}, rt))
		if reverse || upgrading(r) {
			p.upgrade(w, r)
			return
		}
		p.forward(w, r, rt, *life)
	})
	return p, h
}
