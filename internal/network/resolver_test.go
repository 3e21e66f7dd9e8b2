package network_test

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/miekg/dns"
)

// upstream is a DNS server on loopback (UDP and TCP on one port) that
// answers A queries with records answer makes; over UDP it truncates to the
// query's buffer as a real server does.
func upstream(t *testing.T, answer func(q dns.Question) []dns.RR) string {
	t.Helper()
	return serveUpstream(t, func(q *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = answer(q.Question[0])
		return m
	})
}

// serveUpstream is a DNS server on loopback (UDP and TCP on one port)
// that answers what h returns, or nothing when h returns nil; over UDP it
// truncates to the query's buffer as a real server does.
func serveUpstream(t *testing.T, h func(q *dns.Msg) *dns.Msg) string {
	t.Helper()
	hf := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := h(q)
		if m == nil {
			return
		}
		if _, ok := w.LocalAddr().(*net.UDPAddr); ok {
			size := dns.MinMsgSize
			if o := q.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			m.Truncate(size)
		}
		_ = w.WriteMsg(m)
	})
	for range 20 { // the TCP port may be taken
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			continue
		}
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: hf}, {Listener: ln, Handler: hf}} {
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			go srv.ActivateAndServe()
			<-started
			t.Cleanup(func() { _ = srv.Shutdown() })
		}
		return pc.LocalAddr().String()
	}
	t.Fatal("no port free for UDP and TCP")
	return ""
}

func a(name string, ttl uint32, addr netip.Addr) dns.RR {
	return &dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: addr.AsSlice()}
}

// resolverFixture is a fixture whose sandboxes' resolver forwards to an
// upstream answering with answer(host).
func resolverFixture(t *testing.T, answer func(h *testenv.TestHost, q dns.Question) []dns.RR) *fixture {
	var f *fixture
	up := upstream(t, func(q dns.Question) []dns.RR { return answer(f.host, q) })
	f = newFixtureWith(t, -1, func(c *network.Config, _ testenv.NetPlan) { c.Upstreams = []string{up} })
	return f
}

// query asks the slot's resolver for name over netw ("udp" or "tcp"),
// with an EDNS buffer of edns bytes unless 0.
func query(t *testing.T, s network.Slot, netw, name string, edns uint16) *dns.Msg {
	t.Helper()
	var resp *dns.Msg
	err := testenv.InNetNS(s.NetNS, func() error {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Net: netw, Timeout: 5 * time.Second}
		if edns > 0 {
			q.SetEdns0(edns, false)
			c.UDPSize = edns
		}
		var err error
		resp, _, err = c.Exchange(q, netip.AddrPortFrom(s.Resolver, 53).String())
		return err
	})
	if err != nil {
		t.Fatalf("query %s over %s: %v", name, netw, err)
	}
	return resp
}

func addrsOf(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out
}

// An upstream's TTL of days keeps an address allowed (and cached in the
// sandbox) for at most an hour.
func TestResolverCapsTTL(t *testing.T) {
	f := resolverFixture(t, func(h *testenv.TestHost, q dns.Question) []dns.RR {
		return []dns.RR{a(q.Name, 7*24*3600, h.Addr)}
	})
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := query(t, s, "udp", "good.test", 0)
	if !slices.Equal(addrsOf(resp), []netip.Addr{f.host.Addr}) {
		t.Fatalf("answer: %v (test void)", resp)
	}
	if ttl := resp.Answer[0].Header().Ttl; ttl > 3600 {
		t.Errorf("the sandbox is told TTL %d s, more than an hour", ttl)
	}
	allowed, err := f.n.AllowedByName("owner")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := allowed[f.host.Addr]; !ok || d > time.Hour || d < 30*time.Second {
		t.Errorf("%s allowed for %v (%v): want between 30 s and an hour", f.host.Addr, d, ok)
	}
}

// Only A records of the question's name and its CNAME chain are allowed:
// an upstream slipping in "other.test A x" does not open x.
func TestResolverAllowsOnlyTheCNAMEChain(t *testing.T) {
	f := resolverFixture(t, func(h *testenv.TestHost, q dns.Question) []dns.RR {
		return []dns.RR{
			a("other.test", 60, h.Addr2),
			&dns.CNAME{Hdr: dns.RR_Header{Name: "mid.test.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "end.test."},
			&dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "Mid.Test."},
			a("end.test", 60, h.Addr),
		}
	})
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"chain.test"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := query(t, s, "udp", "chain.test", 0)
	if got := addrsOf(resp); !slices.Equal(got, []netip.Addr{f.host.Addr}) {
		t.Errorf("addresses told to the sandbox: %v, want only %s (the chain's end)", got, f.host.Addr)
	}
	if body, err := get(t, s, "http://"+f.host.Addr.String()+"/"); err != nil || body != "hello from "+f.host.Addr.String() {
		t.Fatalf("the address at the end of the CNAME chain: %q %v", body, err)
	}
	if _, err := get(t, s, "http://"+f.host.Addr2.String()+"/"); !refused(err) {
		t.Fatalf("an A record off the question's CNAME chain opened its address: %v", err)
	}
}

// An answer is cut to the client's UDP buffer (512 bytes without EDNS,
// else its EDNS size) with TC set, and only the addresses the client got
// are allowed.
func TestResolverTruncatesToTheClientsBuffer(t *testing.T) {
	f := resolverFixture(t, func(h *testenv.TestHost, q dns.Question) []dns.RR {
		rrs := []dns.RR{a(q.Name, 60, h.Addr)}
		for i := range 98 { // addresses nobody is sent anything at
			rrs = append(rrs, a(q.Name, 60, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})))
		}
		return append(rrs, a(q.Name, 60, h.Addr2))
	})
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"big.test"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := query(t, s, "udp", "big.test", 0)
	resp.Compress = true // as it came: Len then says its size on the wire
	got := addrsOf(resp)
	if !resp.Truncated || len(got) == 0 || len(got) >= 100 || resp.Len() > dns.MinMsgSize {
		t.Fatalf("answer to a client without EDNS: TC %v, %d addresses, %d bytes", resp.Truncated, len(got), resp.Len())
	}
	if slices.Contains(got, f.host.Addr2) || got[0] != f.host.Addr {
		t.Fatalf("the first records should fit and the last not: %v", got)
	}
	allowed, err := f.n.AllowedByName("owner")
	if err != nil {
		t.Fatal(err)
	}
	if len(allowed) != len(got) {
		t.Errorf("%d addresses allowed, %d sent to the sandbox", len(allowed), len(got))
	}
	if _, err := get(t, s, "http://"+f.host.Addr2.String()+"/"); !refused(err) {
		t.Fatalf("an address the sandbox was not told is open: %v", err)
	}
	if body, err := get(t, s, "http://"+f.host.Addr.String()+"/"); err != nil || body != "hello from "+f.host.Addr.String() {
		t.Fatalf("an address the sandbox was told: %q %v", body, err)
	}
	// A client with a large enough EDNS buffer, or over TCP, gets it all.
	for _, tc := range []struct {
		netw string
		edns uint16
	}{{"udp", 4096}, {"tcp", 0}} {
		resp := query(t, s, tc.netw, "big.test", tc.edns)
		if got := addrsOf(resp); resp.Truncated || len(got) != 100 {
			t.Errorf("%s with EDNS %d: TC %v, %d addresses, want all 100", tc.netw, tc.edns, resp.Truncated, len(got))
		}
	}
	if body, err := get(t, s, "http://"+f.host.Addr2.String()+"/"); err != nil || body != "hello from "+f.host.Addr2.String() {
		t.Fatalf("the last address, once told: %q %v", body, err)
	}
}
