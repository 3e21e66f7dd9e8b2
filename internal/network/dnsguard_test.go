package network_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/miekg/dns"
)

// recorder is an upstream that answers good.test (any case) with the test
// host's address, never answers names under flood.test, and keeps every
// query it receives.
type recorder struct {
	addr string
	mu   sync.Mutex
	got  []*dns.Msg
}

func newRecorder(t *testing.T, host func() netip.Addr) *recorder {
	r := &recorder{}
	r.addr = serveUpstream(t, func(q *dns.Msg) *dns.Msg {
		r.mu.Lock()
		r.got = append(r.got, q.Copy())
		r.mu.Unlock()
		qs := q.Question[0]
		if strings.HasSuffix(dns.CanonicalName(qs.Name), ".flood.test.") {
			return nil
		}
		m := new(dns.Msg)
		m.SetReply(q)
		switch qs.Qtype {
		case dns.TypeA:
			m.Answer = []dns.RR{a(qs.Name, 60, host())}
		case dns.TypeTXT:
			m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: qs.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"inbound data"}}}
		}
		return m
	})
	return r
}

func (r *recorder) queries() []*dns.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// guardFixture is a fixture whose resolver forwards to a recorder.
func guardFixture(t *testing.T) (*fixture, *recorder) {
	var f *fixture
	rec := newRecorder(t, func() netip.Addr { return f.host.Addr })
	f = newFixtureWith(t, -1, func(c *network.Config, _ testenv.NetPlan) { c.Upstreams = []string{rec.addr} })
	return f, rec
}

// ask sends q to the slot's resolver over netw from inside its namespace.
func ask(s network.Slot, netw string, q *dns.Msg) (*dns.Msg, error) {
	var resp *dns.Msg
	err := testenv.InNetNS(s.NetNS, func() error {
		c := &dns.Client{Net: netw, Timeout: 5 * time.Second, UDPSize: 4096}
		var err error
		resp, _, err = c.Exchange(q, netip.AddrPortFrom(s.Resolver, 53).String())
		return err
	})
	return resp, err
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// rssKiB is the test process's resident set size.
func rssKiB(t *testing.T) int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// A sandbox flooding its resolver with lookups an upstream never answers
// holds a bounded number of the daemon's (here the test process's) files,
// and another sandbox's lookups are still answered during the flood.
func TestResolverFloodIsBounded(t *testing.T) {
	f, _ := guardFixture(t)
	flooder, err := f.n.Acquire(t.Context(), "flooder", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.n.Acquire(t.Context(), "other", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := addrsOf(query(t, other, "udp", "good.test", 0)); !slices.Equal(got, []netip.Addr{f.host.Addr}) {
		t.Fatalf("before the flood: %v (test void)", got)
	}
	baseFDs, baseRSS := openFDs(t), rssKiB(t)

	var conn net.Conn
	if err := testenv.InNetNS(flooder.NetNS, func() error {
		var err error
		conn, err = net.Dial("udp4", netip.AddrPortFrom(flooder.Resolver, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var sent, servfail atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the flood
		defer wg.Done()
		q := new(dns.Msg)
		for i := 0; ctx.Err() == nil; i++ {
			q.SetQuestion(fmt.Sprintf("q%d.flood.test.", i), dns.TypeA)
			b, _ := q.Pack()
			if _, err := conn.Write(b); err == nil {
				sent.Add(1)
			}
		}
	}()
	go func() { // its answers
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil && m.Rcode == dns.RcodeServerFailure {
				servfail.Add(1)
			}
		}
	}()
	// The other sandbox asks throughout the flood.
	answers := make(chan error, 1)
	go func() {
		var errs []error
		answered := 0
		pace := time.NewTicker(20 * time.Millisecond)
		defer pace.Stop()
		for ctx.Err() == nil {
			q := new(dns.Msg)
			q.SetQuestion("good.test.", dns.TypeA)
			resp, err := ask(other, "udp", q)
			if err == nil && !slices.Equal(addrsOf(resp), []netip.Addr{f.host.Addr}) {
				err = fmt.Errorf("answer %v", resp)
			}
			if err != nil {
				errs = append(errs, err)
			} else {
				answered++
			}
			select { // at 50 a second, well within the slot's rate
			case <-pace.C:
			case <-ctx.Done():
			}
		}
		if answered < 10 {
			errs = append(errs, fmt.Errorf("only %d answered (test void)", answered))
		}
		answers <- errors.Join(errs...)
	}()
	maxFDs, maxRSS := baseFDs, baseRSS
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			maxFDs, maxRSS = max(maxFDs, openFDs(t)), max(maxRSS, rssKiB(t))
		case <-ctx.Done():
		}
	}
	conn.Close()
	wg.Wait()
	t.Logf("flood of %d queries: open files %d -> max %d, RSS %d -> max %d KiB, %d SERVFAIL",
		sent.Load(), baseFDs, maxFDs, baseRSS, maxRSS, servfail.Load())
	if sent.Load() < 1000 {
		t.Fatalf("only %d queries sent (test void)", sent.Load())
	}
	// 64 in flight for the flooder is already generous (the cap is
	// lower); the old forwarder held one socket per query for 2 s.
	if grew := maxFDs - baseFDs; grew > 100 {
		t.Errorf("the flood took the daemon from %d to %d open files", baseFDs, maxFDs)
	}
	if err := <-answers; err != nil {
		t.Errorf("the other sandbox's lookups during the flood: %v", err)
	}
}

// A sandbox opening many TCP connections to its resolver gets only a few
// served at a time; another sandbox's TCP lookups still work.
func TestResolverTCPConnectionsAreBounded(t *testing.T) {
	f, _ := guardFixture(t)
	flooder, err := f.n.Acquire(t.Context(), "flooder", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.n.Acquire(t.Context(), "other", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	const conns = 64
	served := 0
	for i := range conns {
		var c net.Conn
		if err := testenv.InNetNS(flooder.NetNS, func() error {
			var err error
			c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(flooder.Resolver, 53).String(), 5*time.Second)
			return err
		}); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		dc := &dns.Conn{Conn: c}
		q := new(dns.Msg)
		q.SetQuestion("good.test.", dns.TypeA)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := dc.WriteMsg(q); err != nil {
			continue // closed by the resolver
		}
		resp, err := dc.ReadMsg()
		if err == nil && len(addrsOf(resp)) == 1 {
			served++
		} else if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("connection %d: %v", i, err)
		}
		// Left open: the resolver keeps it until its idle timeout.
	}
	if served == 0 {
		t.Fatal("no connection served (test void)")
	}
	if served > 32 {
		t.Errorf("%d of %d open TCP connections from one sandbox served at once", served, conns)
	}
	q := new(dns.Msg)
	q.SetQuestion("good.test.", dns.TypeA)
	if resp, err := ask(other, "tcp", q); err != nil || !slices.Equal(addrsOf(resp), []netip.Addr{f.host.Addr}) {
		t.Errorf("the other sandbox over TCP: %v %v", resp, err)
	}
}

// The upstream gets a query rebuilt from the sandbox's question only: a
// fresh id, lower case, recursion desired, clade's own EDNS and nothing of
// the sandbox's other sections. The sandbox gets the answer on its own id
// and question.
func TestResolverRebuildsTheQuery(t *testing.T) {
	f, rec := guardFixture(t)
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint16 // the upstream's; random, so one may be the sandbox's
	for _, netw := range []string{"udp", "tcp", "udp"} {
		q := new(dns.Msg)
		q.SetQuestion("GoOd.TeSt.", dns.TypeA)
		q.Id = 0x1234
		q.CheckingDisabled = true
		txt := func(s string) dns.RR {
			return &dns.TXT{Hdr: dns.RR_Header{Name: "x.good.test.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{s}}
		}
		q.Answer = []dns.RR{txt("secret-an")}
		q.Ns = []dns.RR{txt("secret-ns")}
		q.Extra = []dns.RR{txt("secret-ar")}
		q.SetEdns0(4096, true)
		q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("secret-opt")})
		before := len(rec.queries())
		resp, err := ask(s, netw, q)
		if err != nil {
			t.Fatalf("%s: %v", netw, err)
		}
		if resp.Id != 0x1234 || len(resp.Question) != 1 || resp.Question[0].Name != "GoOd.TeSt." || !slices.Equal(addrsOf(resp), []netip.Addr{f.host.Addr}) {
			t.Errorf("%s: the sandbox's answer: %v", netw, resp)
		}
		got := rec.queries()[before:]
		if len(got) != 1 {
			t.Fatalf("%s: the upstream got %d queries", netw, len(got))
		}
		up := got[0]
		if strings.Contains(up.String(), "secret") {
			t.Errorf("%s: the sandbox's data reached the upstream:\n%v", netw, up)
		}
		ids = append(ids, up.Id)
		if len(up.Question) != 1 || up.Question[0] != (dns.Question{Name: "good.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET}) {
			t.Errorf("%s: question upstream: %v", netw, up.Question)
		}
		if !up.RecursionDesired || up.CheckingDisabled || len(up.Answer) != 0 || len(up.Ns) != 0 {
			t.Errorf("%s: flags or sections upstream:\n%v", netw, up)
		}
		if o := up.IsEdns0(); len(up.Extra) != 1 || o == nil || len(o.Option) != 0 || o.Do() {
			t.Errorf("%s: additional section upstream: %v", netw, up.Extra)
		}
	}
	if !slices.ContainsFunc(ids, func(id uint16) bool { return id != 0x1234 }) {
		t.Errorf("the upstream got the sandbox's id every time")
	}
}

// Under an allowlist the resolver answers only A, AAAA and CNAME lookups
// of allowed names: others get an empty NOERROR answer and never reach
// the upstream. Without an allowlist they are forwarded.
func TestResolverAllowlistForwardsOnlyAddressLookups(t *testing.T) {
	f, rec := guardFixture(t)
	deny, err := f.n.Acquire(t.Context(), "deny", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	open, err := f.n.Acquire(t.Context(), "open", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	for _, qt := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeSRV, dns.TypeNULL, dns.TypeANY, dns.TypeHTTPS} {
		name := dns.TypeToString[qt]
		before := len(rec.queries())
		q := new(dns.Msg)
		q.SetQuestion("good.test.", qt)
		resp, err := ask(deny, "udp", q)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
			t.Errorf("%s under an allowlist: rcode %s, %d answers", name, dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
		if n := len(rec.queries()) - before; n != 0 {
			t.Errorf("%s under an allowlist reached the upstream %d times", name, n)
		}
	}
	// A still goes upstream, and TXT does without an allowlist.
	for _, tc := range []struct {
		s  network.Slot
		qt uint16
	}{{deny, dns.TypeA}, {open, dns.TypeTXT}} {
		before := len(rec.queries())
		q := new(dns.Msg)
		q.SetQuestion("good.test.", tc.qt)
		resp, err := ask(tc.s, "udp", q)
		if err != nil || len(resp.Answer) != 1 || len(rec.queries()) != before+1 {
			t.Errorf("%s: %v %v, %d upstream queries", dns.TypeToString[tc.qt], resp, err, len(rec.queries())-before)
		}
	}
}
