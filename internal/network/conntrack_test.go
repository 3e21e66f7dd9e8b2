package network_test

// Flows of a slot's address must not outlive its owner or its policy:
// the slot chains accept established flows before any policy rule.

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/miekg/dns"
)

// queryFrom sends one DNS query for name to server from the slot's
// namespace, from UDP source port srcPort (0: any), and returns the answer.
func queryFrom(s network.Slot, srcPort int, server netip.AddrPort, name string) (*dns.Msg, error) {
	var resp *dns.Msg
	err := testenv.InNetNS(s.NetNS, func() error {
		// Generous: the first query of a new slot waits for neighbour
		// discovery on both veths, slow on a loaded machine.
		c := &dns.Client{Net: "udp", Timeout: 4 * time.Second,
			Dialer: &net.Dialer{Timeout: 4 * time.Second, LocalAddr: &net.UDPAddr{Port: srcPort}}}
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		var err error
		resp, _, err = c.Exchange(q, server.String())
		return err
	})
	return resp, err
}

// A slot's address is reused by a later sandbox: the flows of the previous
// owner must not pass as established under the new owner's policy (a
// sandbox created with egress deny reaching a destination the previous
// owner of its address had a flow with, and receiving the replies meant
// for it).
func TestConntrackOfPreviousOwnerDoesNotBypassDeny(t *testing.T) {
	// A range of one slot (a /29): the next owner must get the same
	// address.
	f := newFixtureWith(t, -1, func(c *network.Config, p testenv.NetPlan) {
		c.Range = netip.PrefixFrom(p.Range.Addr(), 29)
	})
	dnsAddr := netip.AddrPortFrom(f.host.Addr, 53)
	const port = 40000

	a, err := f.n.Acquire(t.Context(), "owner-a", network.Policy{Allow: []string{f.p.HostNet.String()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(a, port, dnsAddr, "good.test"); err != nil {
		t.Fatalf("allowed flow from A failed (test void): %v", err)
	}
	if err := f.n.Release(t.Context(), "owner-a"); err != nil {
		t.Fatal(err)
	}
	b, err := f.n.Acquire(t.Context(), "owner-b", network.Policy{Egress: network.EgressDeny})
	if err != nil {
		t.Fatal(err)
	}
	if b.Addr != a.Addr {
		t.Skipf("B got %s, not A's %s: cannot show the reuse", b.Addr, a.Addr)
	}
	// Control: a fresh flow from B is refused.
	if _, err := queryFrom(b, port+1, dnsAddr, "good.test"); err == nil {
		t.Fatal("egress deny let a new flow through")
	}
	if _, err := queryFrom(b, port, dnsAddr, "good.test"); err == nil {
		t.Fatal("egress deny sandbox reached the test host through the previous owner's conntrack entry")
	}
}

// A policy too big for the kernel (a long CIDR list: netlink "message too
// long") is an InvalidArgument naming the limit, and the old policy stays
// in force everywhere.
func TestTooBigPolicyChangeKeepsOldPolicy(t *testing.T) {
	f := newFixture(t, -1)
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	resolver := netip.AddrPortFrom(s.Resolver, 53)
	if r, err := queryFrom(s, 0, resolver, "good.test"); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("allowed name does not resolve (test void): %v %v", r, err)
	}
	var big []string
	for i := range 5000 {
		big = append(big, fmt.Sprintf("11.%d.%d.0/24", i/256, i%256))
	}
	err = f.n.SetPolicy(t.Context(), "owner", network.Policy{Allow: big})
	if err == nil {
		t.Skip("the kernel took 5000 rules; nothing to show")
	}
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("too many rules: want InvalidArgument (a 400 naming the limit), got %v", err)
	}
	r, err := queryFrom(s, 0, resolver, "good.test")
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("after a rejected policy change the old policy (allow good.test) must still hold: rcode %v err %v", r, err)
	}
}

// A policy change that narrows the policy cuts the established flows the
// new policy forbids.
func TestNarrowedPolicyCutsEstablishedFlows(t *testing.T) {
	f := newFixture(t, -1)
	dnsAddr := netip.AddrPortFrom(f.host.Addr, 53)
	const port = 40010
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{f.p.HostNet.String()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(s, port, dnsAddr, "good.test"); err != nil {
		t.Fatalf("allowed flow failed (test void): %v", err)
	}
	// Widening keeps it (and it is still allowed anyway).
	if err := f.n.SetPolicy(t.Context(), "owner", network.Policy{Allow: []string{f.p.HostNet.String(), "good.test"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(s, port, dnsAddr, "good.test"); err != nil {
		t.Fatalf("flow allowed by both policies: %v", err)
	}
	if err := f.n.SetPolicy(t.Context(), "owner", network.Policy{Egress: network.EgressDeny}); err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(s, port, dnsAddr, "good.test"); err == nil {
		t.Fatal("a flow established under the old policy goes on under egress deny")
	}
	// A deny rule added to an allowlist narrows it too.
	if err := f.n.SetPolicy(t.Context(), "owner", network.Policy{Allow: []string{f.p.HostNet.String()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(s, port+1, dnsAddr, "good.test"); err != nil {
		t.Fatalf("allowed flow failed: %v", err)
	}
	if err := f.n.SetPolicy(t.Context(), "owner", network.Policy{Allow: []string{f.p.HostNet.String()}, Deny: []string{f.host.Addr.String()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := queryFrom(s, port+1, dnsAddr, "good.test"); err == nil {
		t.Fatal("a flow established under the old policy goes on to a denied address")
	}
}

// A change the kernel refuses (here a policy past the limit, set without
// it) leaves the old policy in force: the rules and the resolver.
func TestRefusedRulesKeepOldPolicy(t *testing.T) {
	f := newFixture(t, -1)
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	// Too big a batch for the netlink socket's buffer.
	big := make([]string, 0, 1<<18)
	for i := range 1 << 18 {
		big = append(big, fmt.Sprintf("11.%d.%d.%d", i>>16, i>>8&0xff, i&0xff))
	}
	if err := f.n.SetPolicyUnlimited("owner", network.Policy{Allow: big}); err == nil {
		t.Skip("the kernel took 2^18 rules; nothing to show")
	}
	resolver := netip.AddrPortFrom(s.Resolver, 53)
	if r, err := queryFrom(s, 0, resolver, "good.test"); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the resolver follows a policy the kernel refused: %v %v", r, err)
	}
	if body, err := get(t, s, "http://"+f.host.Addr.String()+"/"); err != nil || body != "hello from "+f.host.Addr.String() {
		t.Fatalf("old policy after a refused change: %q %v", body, err)
	}
}

// The limit: MaxPolicyEntries allow and deny entries are taken, one more
// is an InvalidArgument naming the limit.
func TestPolicyEntryLimit(t *testing.T) {
	f := newFixture(t, -1)
	cidrs := func(first, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%d.%d.%d.0/24", first, i/256, i%256))
		}
		return out
	}
	full := network.Policy{Allow: cidrs(11, network.MaxPolicyEntries), Deny: cidrs(12, network.MaxPolicyEntries)}
	if _, err := f.n.Acquire(t.Context(), "owner", full); err != nil {
		t.Fatalf("a policy at the limit: %v", err)
	}
	for _, p := range []network.Policy{
		{Allow: cidrs(11, network.MaxPolicyEntries+1)},
		{Deny: cidrs(12, network.MaxPolicyEntries+1)},
	} {
		err := f.n.SetPolicy(t.Context(), "owner", p)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), fmt.Sprint(network.MaxPolicyEntries)) {
			t.Errorf("a policy past the limit: %v, want InvalidArgument naming %d", err, network.MaxPolicyEntries)
		}
		if _, err := p.Check(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Check of a policy past the limit: %v", err)
		}
	}
}
