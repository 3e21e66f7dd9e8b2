package network

import (
	"bufio"
	"errors"
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

// maxAllowTTL is the most: an upstream's days-long TTL must not keep an
// address open long after the name moved. Answers reach the sandbox with
// their TTLs capped to it, so its caches do not outlive the allowance.
const maxAllowTTL = time.Hour

// errPolicyChanged: the slot's policy changed while a query was answered.
var errPolicyChanged = errors.New("the slot's policy changed during the lookup")

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
	// Keep only what the question resolved to: no AAAA records (there is
	// no IPv6 route) and no A records off the question's CNAME chain (an
	// upstream adding "other.example A x" must not open x).
	chain := cnameChain(qs.Name, resp.Answer)
	ans := resp.Answer[:0]
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.AAAA:
			continue
		case *dns.A:
			if !chain[dns.CanonicalName(rr.Hdr.Name)] {
				continue
			}
		}
		rr.Header().Ttl = min(rr.Header().Ttl, uint32(maxAllowTTL/time.Second))
		ans = append(ans, rr)
	}
	resp.Answer = ans
	resp.Id = q.Id
	// Fit the client's buffer (setting TC when records are left out)
	// before allowing anything: only the addresses the sandbox is told
	// are opened.
	resp.Truncate(clientSize(w, q))
	if r.allowlist() {
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
		ttl = min(ttl, maxAllowTTL)
		if len(addrs) > 0 {
			err := f.n.flush(func(c *nftables.Conn) error {
				if f.n.policyOf(k) != r { // under nftMu, as apply's change
					return errPolicyChanged
				}
				return f.n.rs.allowAddrs(c, k, addrs, ttl)
			})
			if err != nil {
				f.log.Warn("network: allowing resolved addresses failed", "slot", k, "err", err)
				reply(dns.RcodeServerFailure)
				return
			}
		}
	}
	_ = w.WriteMsg(resp)
}

// cnameChain returns the names (canonical: lower case, fully qualified) the answer ans
// leads from qname through CNAME records: qname itself and every target.
func cnameChain(qname string, ans []dns.RR) map[string]bool {
	chain := map[string]bool{dns.CanonicalName(qname): true}
	for grew := true; grew; { // CNAMEs may come in any order
		grew = false
		for _, rr := range ans {
			if c, ok := rr.(*dns.CNAME); ok && chain[dns.CanonicalName(c.Hdr.Name)] {
				if t := dns.CanonicalName(c.Target); !chain[t] {
					chain[t] = true
					grew = true
				}
			}
		}
	}
	return chain
}

// clientSize is the largest answer the client of w takes: 64 KiB over
// TCP; over UDP its EDNS buffer size, or 512 bytes without EDNS.
func clientSize(w dns.ResponseWriter, q *dns.Msg) int {
	if _, ok := w.LocalAddr().(*net.TCPAddr); ok {
		return dns.MaxMsgSize
	}
	if o := q.IsEdns0(); o != nil {
		return max(int(o.UDPSize()), dns.MinMsgSize)
	}
	return dns.MinMsgSize
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
