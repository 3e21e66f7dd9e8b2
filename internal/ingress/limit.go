package ingress

import (
	"net"
	"time"

	"github.com/clade-sandbox/clade/internal/connlimit"
)

// Limit returns ln under the proxy's caps of client connections
// (Config.MaxClientConns, MaxClientConnsPerIP): one over a cap is closed
// as it is accepted, before it sends a byte, so that no client, with a
// token or without, can take the daemon's file descriptors through the
// ingress. Refusals are logged at most once every refusalLogEvery. Serve
// the proxy's Server on it.
func (p *Proxy) Limit(ln net.Listener) *connlimit.Listener {
	return connlimit.New(ln, connlimit.Limits{Total: p.clientMax, PerIP: p.clientPerIP, Refused: p.refused})
}

// refusalLogEvery spaces the log lines of refused client connections: a
// flood is one line a while, not one a connection.
const refusalLogEvery = 10 * time.Second

func (p *Proxy) refused(remote net.Addr, perIP bool) {
	now := time.Now().UnixNano()
	last := p.refusedLog.Load()
	if now-last < int64(refusalLogEvery) || !p.refusedLog.CompareAndSwap(last, now) {
		return
	}
	if perIP {
		p.log.Warn("ingress: refusing client connections over the cap per address (--ingress-max-client-conns-per-ip)", "client", remote.String(), "cap", p.clientPerIP)
		return
	}
	p.log.Warn("ingress: refusing client connections over the total cap (--ingress-max-client-conns)", "client", remote.String(), "cap", p.clientMax)
}
