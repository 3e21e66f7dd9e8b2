package network

import (
	"bufio"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
)

// minAllowTTL is the least time an answered address stays allowed: a
// program connects right after its lookup even when the TTL is 0.
const minAllowTTL = 30 * time.Second

// forwarder is the sandboxes' resolver: one UDP and one TCP server per
// slot, on the slot's gateway address (the sandbox reaches it at the
// shared resolver address, DNAT-ed to its own gateway), so the socket a
// query arrives on names the slot. It forwards only what the slot's policy
// allows and adds the addresses allowed names resolve to to the slot's
// allowed set before answering.
type forwarder struct {
	n         *Network
	upstreams []string
	log       *slog.Logger
	client    *dns.Client
	tcp       *dns.Client

	mu      sync.Mutex
	servers map[int][]*dns.Server
}

func newForwarder(n *Network, upstreams []string, log *slog.Logger) *forwarder {
	return &forwarder{n: n, upstreams: upstreams, log: log, servers: map[int][]*dns.Server{},
		client: &dns.Client{Net: "udp", Timeout: 2 * time.Second},
		tcp:    &dns.Client{Net: "tcp", Timeout: 2 * time.Second}}
}

// readResolvConf returns the nameservers of a resolv.conf as host:53.
func readResolvConf(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

// serve starts slot s's servers.
func (f *forwarder) serve(s *Slot) error {
	addr := netip.AddrPortFrom(s.Gateway, 53).String()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return err
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { f.handle(s.Index, w, q) })
	srvs := []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	for _, srv := range srvs {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				f.log.Debug("network: resolver stopped", "slot", s.Index, "err", err)
			}
		}()
		<-started
	}
	f.mu.Lock()
	f.servers[s.Index] = srvs
	f.mu.Unlock()
	return nil
}

// close stops slot k's servers.
func (f *forwarder) close(k int) {
	f.mu.Lock()
	srvs := f.servers[k]
	delete(f.servers, k)
	f.mu.Unlock()
	for _, srv := range srvs {
		_ = srv.Shutdown()
	}
}

func (f *forwarder) shutdown() {
	f.mu.Lock()
	var ks []int
	for k := range f.servers {
		ks = append(ks, k)
	}
	f.mu.Unlock()
	for _, k := range ks {
		f.close(k)
	}
}

func (f *forwarder) handle(k int, w dns.ResponseWriter, q *dns.Msg) {
	reply := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		_ = w.WriteMsg(m)
	}
	r := f.n.policyOf(k)
	if len(q.Question) != 1 || r == nil || !r.resolves() {
		reply(dns.RcodeRefused)
		return
	}
	qs := q.Question[0]
	if !r.allowsName(qs.Name) {
		reply(dns.RcodeRefused)
		return
	}
	if qs.Qtype == dns.TypeAAAA {
		// Sandboxes have no IPv6: an empty answer sends programs to A.
		m := new(dns.Msg)
		m.SetReply(q)
		_ = w.WriteMsg(m)
		return
	}
	resp := f.exchange(q)
	if resp == nil {
		reply(dns.RcodeServerFailure)
		return
	}
	if r.allowlist() {
		// Every A record of the answer (CNAME targets included) is what
		// the allowed name resolved to.
		var addrs []netip.Addr
		ttl := minAllowTTL
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
					addrs = append(addrs, ip)
					ttl = max(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
				}
			}
		}
		if len(addrs) > 0 {
			err := f.n.flush(func(c *nftables.Conn) error { return f.n.rs.allowAddrs(c, k, addrs, ttl) })
			if err != nil {
				f.log.Warn("network: allowing resolved addresses failed", "slot", k, "err", err)
				reply(dns.RcodeServerFailure)
				return
			}
		}
	}
	// Strip AAAA records: there is no IPv6 route.
	ans := resp.Answer[:0]
	for _, rr := range resp.Answer {
		if _, ok := rr.(*dns.AAAA); !ok {
			ans = append(ans, rr)
		}
	}
	resp.Answer = ans
	resp.Id = q.Id
	_ = w.WriteMsg(resp)
}

// exchange asks the upstreams in turn; nil when none answers.
func (f *forwarder) exchange(q *dns.Msg) *dns.Msg {
	for _, up := range f.upstreams {
		resp, _, err := f.client.Exchange(q, up)
		if err == nil && resp.Truncated {
			resp, _, err = f.tcp.Exchange(q, up)
		}
		if err == nil {
			return resp
		}
		f.log.Debug("network: upstream resolver failed", "upstream", up, "err", err)
	}
	return nil
}
