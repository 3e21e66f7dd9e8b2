package network

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// answerFor turns whatever an upstream sends into an answer that packs,
// is on the sandbox's id and question, and under an allowlist holds only
// A and CNAME records of the question's chain.
func FuzzAnswerFor(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("Good.Test.", dns.TypeA)
	q.SetEdns0(4096, false)
	r := new(dns.Msg)
	r.SetReply(upstreamQuery(q.Question[0]))
	r.Answer = []dns.RR{
		&dns.CNAME{Hdr: dns.RR_Header{Name: "good.test.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 1 << 30}, Target: "end.test."},
		&dns.A{Hdr: dns.RR_Header{Name: "end.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)},
		&dns.A{Hdr: dns.RR_Header{Name: "other.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 2)},
		&dns.TXT{Hdr: dns.RR_Header{Name: "good.test.", Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"x"}},
	}
	r.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60}, Ns: "ns.test.", Mbox: "m.test."}}
	r.SetEdns0(1232, true)
	qb, _ := q.Pack()
	rb, _ := r.Pack()
	f.Add(qb, rb, true)
	f.Add(qb, rb, false)
	f.Fuzz(func(t *testing.T, qb, rb []byte, allowlist bool) {
		q, resp := new(dns.Msg), new(dns.Msg)
		if q.Unpack(qb) != nil || resp.Unpack(rb) != nil || len(q.Question) != 1 {
			return
		}
		m := answerFor(q, resp, allowlist)
		if _, err := m.Pack(); err != nil {
			t.Fatalf("the answer does not pack: %v\n%v", err, m)
		}
		if m.Id != q.Id || len(m.Question) != 1 || m.Question[0] != q.Question[0] || !m.Response {
			t.Fatalf("answer not to the query: %v", m)
		}
		chain := cnameChain(q.Question[0].Name, resp.Answer)
		for _, rr := range m.Answer {
			switch rr.(type) {
			case *dns.AAAA:
				t.Fatalf("AAAA in the answer: %v", rr)
			case *dns.A, *dns.CNAME:
				if !chain[dns.CanonicalName(rr.Header().Name)] {
					t.Fatalf("off the chain: %v", rr)
				}
			default:
				if allowlist {
					t.Fatalf("under an allowlist: %v", rr)
				}
			}
			if rr.Header().Ttl > 3600 {
				t.Fatalf("TTL not capped: %v", rr)
			}
		}
		for _, rr := range m.Extra {
			if _, ok := rr.(*dns.OPT); !ok {
				t.Fatalf("additional record kept: %v", rr)
			}
		}
	})
}
