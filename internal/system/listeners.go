package system

import (
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/internal/connlimit"
)

// limitAPI puts a TCP listener of the API (--listen, --e2b) under a cap of
// its own: a sixteenth of the daemon's file limit, at most 4096
// connections (an E2B one may hold a sandbox connection too). Clients of
// one, with a token or without, cannot take the descriptors that the
// socket, the other listeners and the sandboxes need, and the ingress
// (capped by its own, at most half of them) cannot take this one's. The
// unix socket, reachable only by the daemon's users, has no cap.
func limitAPI(ln net.Listener, name string, log *slog.Logger) net.Listener {
	n := connlimit.Share(connlimit.FDLimit(), 16, 4096)
	var last atomic.Int64
	return connlimit.New(ln, connlimit.Limits{Total: n, Refused: func(remote net.Addr, _ bool) {
		now, l := time.Now().UnixNano(), last.Load()
		if now-l >= int64(10*time.Second) && last.CompareAndSwap(l, now) {
			log.Warn(name+": refusing connections over the cap of the daemon's file limit", "client", remote.String(), "cap", n)
		}
	}})
}
