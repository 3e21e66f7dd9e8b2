package network_test

import (
	"reflect"
	"testing"

	"github.com/clade-sandbox/clade/internal/network"
)

// Check returns the canonical form the store records and inspect shows.
func TestPolicyCheckCanonical(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   network.Policy
		want network.Policy
	}{
		{"default", network.Policy{}, network.Policy{Egress: "allow"}},
		{"deny", network.Policy{Egress: "deny"}, network.Policy{Egress: "deny"}},
		{"allowlist says deny", network.Policy{Allow: []string{"Good.Test."}}, network.Policy{Egress: "deny", Allow: []string{"good.test"}}},
		{"allowlist with egress allow says deny", network.Policy{Egress: "allow", Allow: []string{"10.1.2.3/8", "*.Example.com"}},
			network.Policy{Egress: "deny", Allow: []string{"10.0.0.0/8", "*.example.com"}}},
		{"deny rules alone keep egress allow", network.Policy{Deny: []string{"203.0.113.7"}},
			network.Policy{Egress: "allow", Deny: []string{"203.0.113.7/32"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Check()
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Check(%+v) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			again, err := got.Check()
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("the canonical form is not stable: %+v, %v", again, err)
			}
		})
	}
}

// An allowed name that resolves into a private range does not open it
// (DNS rebinding into the host's LAN); a CIDR rule does.
func TestNamesDoNotOpenPrivateRanges(t *testing.T) {
	f := newFixture(t, -1)
	url := "http://" + f.host.Private.String() + "/"
	s, err := f.n.Acquire(t.Context(), "owner", network.Policy{Allow: []string{"private.test"}})
	if err != nil {
		t.Fatal(err)
	}
	addrs, _, err := lookup(t, s, "private.test")
	if err != nil || len(addrs) != 1 || addrs[0] != f.host.Private.String() {
		t.Fatalf("lookup private.test: %v %v (test void)", addrs, err)
	}
	if _, err := get(t, s, url); !refused(err) {
		t.Fatalf("a private address reachable because an allowed name resolved to it: %v\n%s", err, ruleset(f.p.Prefix))
	}
	if err := f.n.SetPolicy(t.Context(), "owner", network.Policy{Allow: []string{"private.test", f.p.PrivateNet.String()}}); err != nil {
		t.Fatal(err)
	}
	if body, err := get(t, s, url); err != nil || body != "hello from "+f.host.Private.String() {
		t.Fatalf("a private range a CIDR rule opens: %q %v", body, err)
	}
}
