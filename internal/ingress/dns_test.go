package ingress_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/miekg/dns"
)

// startDNS serves the ingress DNS for clade.localhost, answering with
// addrs, on loopback UDP and TCP (the same port), and returns its address.
func startDNS(t *testing.T, addrs ...netip.Addr) string {
	t.Helper()
	s, err := ingress.NewDNS(ingress.DNSConfig{Domain: "Clade.Localhost.", Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	s.Serve(pc, ln)
	t.Cleanup(s.Close)
	return pc.LocalAddr().String()
}

func query(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	r, _, err := c.Exchange(q, addr)
	if err != nil {
		t.Fatalf("%s query %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	if r.Id != q.Id || !r.Response {
		t.Fatalf("%s: answer %v does not answer the query", name, r)
	}
	return r
}

func answers(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.Hdr.Name+" "+rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.Hdr.Name+" "+rr.AAAA.String())
		default:
			out = append(out, rr.String())
		}
	}
	return out
}

// TestDNSAnswersIngressNames resolves names through the ingress's DNS
// server with real UDP and TCP queries on loopback: the domain's names
// are the ingress's address, authoritatively; every other name is refused.
func TestDNSAnswersIngressNames(t *testing.T) {
	addr := startDNS(t, netip.MustParseAddr("127.0.0.1"))
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			for _, name := range []string{"49999-0123456789abcdef.clade.localhost.", "8000-MyBox.CLADE.localhost.", "clade.localhost.", "a.b.clade.localhost."} {
				r := query(t, network, addr, name, dns.TypeA)
				if r.Rcode != dns.RcodeSuccess || !r.Authoritative || r.RecursionAvailable {
					t.Fatalf("%s: rcode %s aa %v ra %v", name, dns.RcodeToString[r.Rcode], r.Authoritative, r.RecursionAvailable)
				}
				if got, want := answers(r), []string{name + " 127.0.0.1"}; !slices.Equal(got, want) {
					t.Fatalf("%s A: %q, want %q", name, got, want)
				}
				if r.Answer[0].Header().Ttl == 0 {
					t.Fatalf("%s: TTL 0", name)
				}
			}
			// The name exists without an AAAA (or a TXT): NODATA with the SOA.
			for _, qt := range []uint16{dns.TypeAAAA, dns.TypeTXT, dns.TypeHTTPS} {
				r := query(t, network, addr, "80-x.clade.localhost.", qt)
				if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 || len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA {
					t.Fatalf("%s: %v", dns.TypeToString[qt], r)
				}
			}
			// Anything else is refused, not forwarded.
			for _, name := range []string{"example.com.", "clade.localhost.example.com.", "evilclade.localhost.", "localhost.", "."} {
				r := query(t, network, addr, name, dns.TypeA)
				if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 || r.Authoritative {
					t.Fatalf("%s: %v", name, r)
				}
			}
		})
	}

	// Go's own resolver, pointed at the server, finds the ingress.
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	got, err := res.LookupHost(t.Context(), "49983-abc.clade.localhost")
	if err != nil || !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Fatalf("LookupHost: %v, %v", got, err)
	}
	if _, err := res.LookupHost(t.Context(), "github.com"); err == nil {
		t.Fatal("a name outside the domain resolved")
	}
}

// TestDNSBothFamilies answers A and AAAA from the addresses given.
func TestDNSBothFamilies(t *testing.T) {
	addr := startDNS(t, netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("::ffff:127.0.0.3"))
	if got, want := answers(query(t, "udp", addr, "x.clade.localhost.", dns.TypeA)), []string{"x.clade.localhost. 127.0.0.2", "x.clade.localhost. 127.0.0.3"}; !slices.Equal(got, want) {
		t.Fatalf("A: %q, want %q", got, want)
	}
	if got, want := answers(query(t, "udp", addr, "x.clade.localhost.", dns.TypeAAAA)), []string{"x.clade.localhost. ::1"}; !slices.Equal(got, want) {
		t.Fatalf("AAAA: %q, want %q", got, want)
	}
}

func TestNewDNSRefuses(t *testing.T) {
	for name, cfg := range map[string]ingress.DNSConfig{
		"no domain":   {Domain: "..", Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		"no address":  {Domain: "clade.localhost"},
		"unspecified": {Domain: "clade.localhost", Addrs: []netip.Addr{netip.MustParseAddr("0.0.0.0")}},
		"bad domain":  {Domain: "a..b", Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
	} {
		if _, err := ingress.NewDNS(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestDNSHostileQueries sends what no resolver would: garbage, answers,
// several questions, other opcodes and classes, a future EDNS version.
// Each gets a refusal or nothing, and the server answers on afterwards.
func TestDNSHostileQueries(t *testing.T) {
	addr := startDNS(t, netip.MustParseAddr("127.0.0.1"))
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, b := range [][]byte{{}, {0}, make([]byte, 12), []byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 4000)} {
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}

	exchange := func(q *dns.Msg) *dns.Msg {
		t.Helper()
		r, _, err := (&dns.Client{Timeout: 10 * time.Second}).Exchange(q, addr)
		if err != nil {
			t.Fatalf("%v: %v", q, err)
		}
		return r
	}
	q := new(dns.Msg)
	q.SetQuestion("a.clade.localhost.", dns.TypeA)
	q.Question = append(q.Question, dns.Question{Name: "b.clade.localhost.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	if r := exchange(q); r.Rcode != dns.RcodeFormatError || len(r.Answer) != 0 {
		t.Fatalf("two questions: %v", r)
	}
	q = new(dns.Msg)
	q.SetQuestion("a.clade.localhost.", dns.TypeA)
	q.Question[0].Qclass = dns.ClassCHAOS
	if r := exchange(q); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Fatalf("class CH: %v", r)
	}
	q = new(dns.Msg)
	q.SetQuestion("a.clade.localhost.", dns.TypeA)
	q.SetEdns0(4096, false)
	q.IsEdns0().SetVersion(1)
	if r := exchange(q); r.Rcode != dns.RcodeBadVers || len(r.Answer) != 0 {
		t.Fatalf("EDNS version 1: %v", r)
	}
	q = new(dns.Msg)
	q.SetQuestion("a.clade.localhost.", dns.TypeA)
	q.SetEdns0(4096, true)
	if r := exchange(q); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.IsEdns0() == nil {
		t.Fatalf("EDNS 0: %v", r)
	}
	// An answer sent to it gets no answer back (no loops between servers).
	q = new(dns.Msg)
	q.SetQuestion("a.clade.localhost.", dns.TypeA)
	q.Response = true
	if _, _, err := (&dns.Client{Timeout: 500 * time.Millisecond}).Exchange(q, addr); err == nil {
		t.Fatal("an answer was answered")
	}
	if got := answers(query(t, "udp", addr, "49999-x.clade.localhost.", dns.TypeA)); len(got) != 1 {
		t.Fatalf("after the hostile queries: %q", got)
	}
}

// FuzzDNSAnswer feeds the server's answer function every message the
// parser accepts: it never panics, its answer packs, and the answer is
// never much bigger than the query (no amplification).
func FuzzDNSAnswer(f *testing.F) {
	s, err := ingress.NewDNS(ingress.DNSConfig{Domain: "clade.localhost", Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}})
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range []string{"49999-x.clade.localhost.", "example.com.", "."} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeANY} {
			q := new(dns.Msg)
			q.SetQuestion(name, qt)
			q.SetEdns0(1232, false)
			b, _ := q.Pack()
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q := new(dns.Msg)
		if q.Unpack(b) != nil {
			return
		}
		r := s.Answer(q)
		if r == nil {
			return
		}
		out, err := r.Pack()
		if err != nil {
			t.Fatalf("answer to %v does not pack: %v", q, err)
		}
		if len(out) > 512+len(b) {
			t.Fatalf("a %d-byte query got a %d-byte answer", len(b), len(out))
		}
	})
}
