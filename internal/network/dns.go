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

// ednsSize is the UDP message size the forwarder advertises, to the
// upstreams and to the sandboxes: the size DNS flag day 2020 settled on,
// which needs no IP fragments.
const ednsSize = 1232

// forwarder is the sandboxes' resolver: one UDP and one TCP server per
// slot, on the slot's gateway address (the sandbox reaches it at the
// shared resolver address, DNAT-ed to its own gateway), so the socket a
// query arrives on names the slot. It forwards only what the slot's policy
// allows, as a query it builds itself from the question (nothing else of
// the sandbox's message reaches the upstream), and adds the addresses
// allowed names resolve to to the slot's allowed set before answering.
// What a slot's queries may hold of the daemon is bounded (dnsguard.go).
type forwarder struct {
	n         *Network
	upstreams []string
	log       *slog.Logger
	client    *dns.Client
	tcp       *dns.Client
	all       guard // what all slots' queries hold

	mu      sync.Mutex
	servers map[int][]*dns.Server
}

func newForwarder(n *Network, upstreams []string, log *slog.Logger) *forwarder {
	return &forwarder{n: n, upstreams: upstreams, log: log, servers: map[int][]*dns.Server{},
		client: &dns.Client{Net: "udp", Timeout: upstreamTimeout, UDPSize: ednsSize},
		tcp:    &dns.Client{Net: "tcp", Timeout: upstreamTimeout}}
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
	g := newGuard()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { f.handle(s.Index, g, w, q) })
	idle := func() time.Duration { return tcpIdleTimeout }
	srvs := []*dns.Server{
		{PacketConn: pc, Handler: h, UDPSize: ednsSize},
		{Listener: &guardedListener{Listener: ln, slot: g, all: &f.all}, Handler: h,
			ReadTimeout: tcpReadTimeout, WriteTimeout: tcpReadTimeout, IdleTimeout: idle},
	}
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

// handle answers slot k's query q. Over the slot's rate it is dropped;
// over the in-flight caps it gets SERVFAIL at once. A question that is
// not one IN query of a name the policy allows gets REFUSED (NOTIMP for
// an opcode other than QUERY). AAAA gets an empty answer (sandboxes have
// no IPv6), and so, under an allowlist, does every type but A and CNAME:
// other records of an allowed name (TXT above all) are a channel to
// whoever serves it that egress deny must not open, and an empty answer
// sends programs on rather than failing their lookup.
func (f *forwarder) handle(k int, g *guard, w dns.ResponseWriter, q *dns.Msg) {
	if !g.allow(time.Now()) {
		return
	}
	reply := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		_ = w.WriteMsg(m)
	}
	if q.Opcode != dns.OpcodeQuery {
		reply(dns.RcodeNotImplemented)
		return
	}
	r := f.n.policyOf(k)
	if len(q.Question) != 1 || r == nil || !r.resolves() {
		reply(dns.RcodeRefused)
		return
	}
	qs := q.Question[0]
	if qs.Qclass != dns.ClassINET || !r.allowsName(qs.Name) || metaType(qs.Qtype) ||
		r.allowlist() && strings.ContainsRune(qs.Name, '\\') {
		reply(dns.RcodeRefused)
		return
	}
	if qs.Qtype == dns.TypeAAAA || r.allowlist() && qs.Qtype != dns.TypeA && qs.Qtype != dns.TypeCNAME {
		m := new(dns.Msg)
		m.SetReply(q)
		_ = w.WriteMsg(m)
		return
	}
	if !f.acquire(g) {
		reply(dns.RcodeServerFailure)
		return
	}
	defer f.release(g)
	resp := f.exchange(upstreamQuery(qs))
	if resp == nil {
		reply(dns.RcodeServerFailure)
		return
	}
	resp = answerFor(q, resp, r.allowlist())
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

// metaType reports whether t asks for something other than records (a
// zone transfer, ANY's elders): no resolver answers those to a stub.
func metaType(t uint16) bool {
	switch t {
	case dns.TypeOPT, dns.TypeIXFR, dns.TypeAXFR, dns.TypeMAILB, dns.TypeMAILA:
		return true
	}
	return false
}

// upstreamQuery is the query the forwarder sends upstream for a sandbox's
// question qs: that question in lower case and nothing else of the
// sandbox's message (not its id, flags, other sections or EDNS options),
// so none of it can carry data to whoever serves the name.
func upstreamQuery(qs dns.Question) *dns.Msg {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{{Name: strings.ToLower(dns.Fqdn(qs.Name)), Qtype: qs.Qtype, Qclass: dns.ClassINET}}
	m.SetEdns0(ednsSize, false)
	return m
}

// answerFor is the answer to the sandbox's query q made from resp, the
// upstream's answer to upstreamQuery: on q's id, flags and question (in
// q's case, as are records of its name), with resp's rcode and of resp's
// records only those a stub uses. The answer section keeps no AAAA
// records (there is no IPv6 route) and no A or CNAME records off the
// question's CNAME chain (an upstream adding "other.example A x" must not
// open x); under an allowlist it keeps only A and CNAME records, and the
// authority section only SOA records. Nothing of the additional section is
// kept; the answer has clade's EDNS if q has EDNS. TTLs are capped to
// maxAllowTTL.
func answerFor(q, resp *dns.Msg, allowlist bool) *dns.Msg {
	qs := q.Question[0]
	m := new(dns.Msg)
	m.SetReply(q)
	m.Rcode = resp.Rcode
	if m.Rcode > 0xF { // an extended rcode answers clade's EDNS, not the sandbox's
		m.Rcode = dns.RcodeServerFailure
	}
	m.RecursionAvailable = resp.RecursionAvailable
	qname := dns.CanonicalName(qs.Name)
	chain := cnameChain(qs.Name, resp.Answer)
	keep := func(rr dns.RR) {
		h := rr.Header()
		h.Ttl = min(h.Ttl, uint32(maxAllowTTL/time.Second))
		if dns.CanonicalName(h.Name) == qname {
			h.Name = qs.Name
		}
	}
	for _, rr := range resp.Answer {
		switch rr.(type) {
		case *dns.AAAA:
			continue
		case *dns.A, *dns.CNAME:
			if !chain[dns.CanonicalName(rr.Header().Name)] {
				continue
			}
		default:
			if allowlist {
				continue
			}
		}
		keep(rr)
		m.Answer = append(m.Answer, rr)
	}
	for _, rr := range resp.Ns {
		if _, soa := rr.(*dns.SOA); allowlist && !soa {
			continue
		}
		keep(rr)
		m.Ns = append(m.Ns, rr)
	}
	if q.IsEdns0() != nil {
		m.SetEdns0(ednsSize, false)
	}
	return m
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

// exchange asks the upstreams in turn for q; nil when none answers it.
func (f *forwarder) exchange(q *dns.Msg) *dns.Msg {
	for _, up := range f.upstreams {
		resp, _, err := f.client.Exchange(q, up)
		if err == nil && resp.Truncated {
			resp, _, err = f.tcp.Exchange(q, up)
		}
		if err == nil && !answers(resp, q) {
			err = errors.New("the answer is not to the question")
		}
		if err == nil {
			return resp
		}
		f.log.Debug("network: upstream resolver failed", "upstream", up, "err", err)
	}
	return nil
}

// answers reports whether resp is an answer to q's question.
func answers(resp, q *dns.Msg) bool {
	if !resp.Response || len(resp.Question) != 1 {
		return false
	}
	a, b := resp.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && dns.CanonicalName(a.Name) == dns.CanonicalName(b.Name)
}
