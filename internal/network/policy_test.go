package network_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
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

// Edit changes a policy rule by rule, comparing rules in canonical form,
// and keeps the egress unless told: removing the last allow rule closes
// everything instead of opening it.
func TestPolicyEdit(t *testing.T) {
	base := network.Policy{Allow: []string{"example.com", "10.9.0.0/16"}, Deny: []string{"203.0.113.7"}}
	for _, tc := range []struct {
		name string
		in   network.Policy
		edit network.PolicyEdit
		want network.Policy
	}{
		{"add keeps the others", base, network.PolicyEdit{AddAllow: []string{"Good.Test."}},
			network.Policy{Egress: "deny", Allow: []string{"example.com", "10.9.0.0/16", "good.test"}, Deny: []string{"203.0.113.7/32"}}},
		{"add held rule is no-op", base, network.PolicyEdit{AddAllow: []string{"EXAMPLE.com", "10.9.1.1/16"}, AddDeny: []string{"203.0.113.7/32"}},
			network.Policy{Egress: "deny", Allow: []string{"example.com", "10.9.0.0/16"}, Deny: []string{"203.0.113.7/32"}}},
		{"remove by canonical form", base, network.PolicyEdit{RemoveAllow: []string{"10.9.3.4/16"}, RemoveDeny: []string{"203.0.113.7"}},
			network.Policy{Egress: "deny", Allow: []string{"example.com"}}},
		{"remove absent is no-op", base, network.PolicyEdit{RemoveAllow: []string{"other.test"}},
			network.Policy{Egress: "deny", Allow: []string{"example.com", "10.9.0.0/16"}, Deny: []string{"203.0.113.7/32"}}},
		{"remove the last allow keeps deny", network.Policy{Allow: []string{"example.com"}}, network.PolicyEdit{RemoveAllow: []string{"example.com"}},
			network.Policy{Egress: "deny"}},
		{"remove then add", network.Policy{Allow: []string{"a.test"}}, network.PolicyEdit{RemoveAllow: []string{"a.test"}, AddAllow: []string{"a.test", "b.test"}},
			network.Policy{Egress: "deny", Allow: []string{"a.test", "b.test"}}},
		{"egress set", network.Policy{Allow: []string{"a.test"}}, network.PolicyEdit{Egress: "allow", RemoveAllow: []string{"a.test"}},
			network.Policy{Egress: "allow"}},
		{"add to an open policy makes an allowlist", network.Policy{}, network.PolicyEdit{AddAllow: []string{"a.test"}},
			network.Policy{Egress: "deny", Allow: []string{"a.test"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Edit(tc.edit)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Edit(%+v, %+v) = %+v, %v; want %+v", tc.in, tc.edit, got, err, tc.want)
			}
		})
	}
	full := make([]string, network.MaxPolicyEntries)
	for i := range full {
		full[i] = fmt.Sprintf("h%d.test", i)
	}
	for _, tc := range []struct {
		name string
		in   network.Policy
		edit network.PolicyEdit
	}{
		{"bad allow", base, network.PolicyEdit{AddAllow: []string{"not a host"}}},
		{"bad remove", base, network.PolicyEdit{RemoveDeny: []string{"example.com"}}},
		{"bad egress", base, network.PolicyEdit{Egress: "maybe"}},
		{"too many in the result", network.Policy{Allow: full}, network.PolicyEdit{AddAllow: []string{"one.more.test"}}},
		{"too many removals", base, network.PolicyEdit{RemoveAllow: append(full, "x.test")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.in.Edit(tc.edit); !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("Edit: %v, want InvalidArgument", err)
			}
		})
	}
}

// FuzzPolicyEdit: any edit of any policy (rules from a client) either is
// refused as InvalidArgument or gives a policy in canonical form.
func FuzzPolicyEdit(f *testing.F) {
	f.Add("example.com", "10.0.0.0/8", "203.0.113.7", "", "deny")
	f.Add("*.Example.COM.", "10.1.2.3/8", "1.2.3.4/0", "::1", "")
	f.Add("", "", "", "", "maybe")
	f.Fuzz(func(t *testing.T, have, add, remove, deny, egress string) {
		p := network.Policy{Allow: []string{have}, Deny: []string{deny}}
		got, err := p.Edit(network.PolicyEdit{Egress: egress, AddAllow: []string{add}, RemoveAllow: []string{remove}, AddDeny: []string{remove}, RemoveDeny: []string{deny}})
		if err != nil {
			if !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("Edit: %v, want InvalidArgument", err)
			}
			return
		}
		if again, err := got.Check(); err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("Edit gave %+v, not canonical: %+v, %v", got, again, err)
		}
	})
}
