package network

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Egress modes: what happens to destinations no rule names.
const (
	EgressAllow = "allow"
	EgressDeny  = "deny"
)

// MaxPolicyEntries is how many allow entries, and how many deny entries, a
// policy may hold: every entry is a rule in the slot's chain, and a chain
// far larger than this no longer fits in one atomic nftables update.
const MaxPolicyEntries = 256

// Policy is a sandbox's egress policy as the user states it.
type Policy struct {
	// Egress is EgressAllow (the default) or EgressDeny.
	Egress string
	// Allow lists HOST, *.DOMAIN or CIDR (or a bare IPv4 address) rules.
	// Any entry makes the policy an allowlist, whatever Egress says (Check
	// then says EgressDeny). At most MaxPolicyEntries.
	Allow []string
	// Deny lists CIDRs (or bare IPv4 addresses) that are always refused.
	// At most MaxPolicyEntries.
	Deny []string
}

// rules is a checked Policy.
type rules struct {
	allowAll   bool // egress allow and no allowlist
	allowCIDRs []netip.Prefix
	hosts      []string // exact names, lower case, no trailing dot
	domains    []string // "*.example.com" as ".example.com"
	denyCIDRs  []netip.Prefix
}

// allowlist reports whether only what the rules name is allowed.
func (r *rules) allowlist() bool { return !r.allowAll }

// names reports whether the resolver may forward queries at all.
func (r *rules) resolves() bool { return r.allowAll || len(r.hosts) > 0 || len(r.domains) > 0 }

// allowsName reports whether a lookup of name may be forwarded, and its
// answers allowed.
func (r *rules) allowsName(name string) bool {
	if r.allowAll {
		return true
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if slices.Contains(r.hosts, name) {
		return true
	}
	for _, d := range r.domains {
		if strings.HasSuffix(name, d) {
			return true
		}
	}
	return false
}

// widens reports whether r allows every destination old allows, so a
// change from old to r cuts no connection. A nil old (a closed slot) is
// widened by anything.
func (r *rules) widens(old *rules) bool {
	if old == nil {
		return true
	}
	if !subset(r.denyCIDRs, old.denyCIDRs) {
		return false
	}
	if r.allowAll {
		return true
	}
	return !old.allowAll && subset(old.allowCIDRs, r.allowCIDRs) &&
		subset(old.hosts, r.hosts) && subset(old.domains, r.domains)
}

// equal reports whether r and o are the same rules; a nil r (no rules
// applied yet) equals nothing.
func (r *rules) equal(o *rules) bool {
	return r != nil && o != nil && r.allowAll == o.allowAll && slices.Equal(r.allowCIDRs, o.allowCIDRs) &&
		slices.Equal(r.hosts, o.hosts) && slices.Equal(r.domains, o.domains) && slices.Equal(r.denyCIDRs, o.denyCIDRs)
}

// subset reports whether every element of a is in b.
func subset[T comparable](a, b []T) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// Check validates p and returns it in canonical form (lower-case names,
// masked CIDRs, the default egress filled in, EgressDeny for an
// allowlist). Errors are InvalidArgument, including more than
// MaxPolicyEntries allow or deny entries.
func (p Policy) Check() (Policy, error) {
	_, c, err := p.compile()
	return c, err
}

func (p Policy) compile() (*rules, Policy, error) {
	for _, l := range []struct {
		what string
		n    int
	}{{"allow", len(p.Allow)}, {"deny", len(p.Deny)}} {
		if l.n > MaxPolicyEntries {
			return nil, Policy{}, errdefs.New(errdefs.InvalidArgument, "too many %s rules (%d): a policy holds at most %d; use wider CIDRs or *.DOMAIN rules", l.what, l.n, MaxPolicyEntries)
		}
	}
	return p.compileUnlimited()
}

// compileUnlimited is compile without the limit on the number of entries.
func (p Policy) compileUnlimited() (*rules, Policy, error) {
	out := Policy{Egress: p.Egress}
	switch p.Egress {
	case "":
		out.Egress = EgressAllow
	case EgressAllow, EgressDeny:
	default:
		return nil, Policy{}, errdefs.New(errdefs.InvalidArgument, "bad egress %q: use allow or deny", p.Egress)
	}
	r := &rules{}
	for _, a := range p.Allow {
		a = strings.ToLower(strings.TrimSpace(a))
		if pfx, ok := parseCIDR(a); ok {
			if !pfx.Addr().Is4() {
				return nil, Policy{}, errdefs.New(errdefs.InvalidArgument, "bad allow rule %q: sandboxes have no IPv6; use an IPv4 CIDR, HOST or *.DOMAIN", a)
			}
			r.allowCIDRs = append(r.allowCIDRs, pfx)
			out.Allow = append(out.Allow, pfx.String())
			continue
		}
		name := strings.TrimSuffix(a, ".")
		wild := false
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			name, wild = rest, true
		}
		if !validHostname(name) {
			return nil, Policy{}, errdefs.New(errdefs.InvalidArgument, "bad allow rule %q: use HOST, *.DOMAIN or an IPv4 CIDR", a)
		}
		if wild {
			r.domains = append(r.domains, "."+name)
			out.Allow = append(out.Allow, "*."+name)
		} else {
			r.hosts = append(r.hosts, name)
			out.Allow = append(out.Allow, name)
		}
	}
	for _, d := range p.Deny {
		d = strings.TrimSpace(d)
		pfx, ok := parseCIDR(d)
		if !ok || !pfx.Addr().Is4() {
			return nil, Policy{}, errdefs.New(errdefs.InvalidArgument, "bad deny rule %q: use an IPv4 CIDR such as 203.0.113.0/24", d)
		}
		r.denyCIDRs = append(r.denyCIDRs, pfx)
		out.Deny = append(out.Deny, pfx.String())
	}
	if len(out.Allow) > 0 {
		out.Egress = EgressDeny // an allowlist: what it does not name is refused
	}
	r.allowAll = out.Egress == EgressAllow
	return r, out, nil
}

// parseCIDR parses a CIDR or a bare address (as a single-address prefix).
func parseCIDR(s string) (netip.Prefix, bool) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, a.BitLen()), true
}

func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// PolicyEdit is a change to a policy, as opposed to a whole new one: rules
// to add and to remove, and the default for destinations no rule names.
type PolicyEdit struct {
	// Egress is EgressAllow or EgressDeny; empty keeps the policy's.
	Egress                string
	AddAllow, RemoveAllow []string
	AddDeny, RemoveDeny   []string
}

// Edit returns p with e applied, checked and in canonical form. Rules are
// compared in canonical form (a bare address is its /32, names are lower
// case): removals come first, and removing a rule p does not hold changes
// nothing; an added rule p already holds is not added again. The egress
// stays p's unless e sets it, so removing the last allow rule of an
// allowlist leaves egress deny (nothing allowed), never everything open.
// Errors are InvalidArgument: a bad rule, more than MaxPolicyEntries in a
// list of e or in the result.
func (p Policy) Edit(e PolicyEdit) (Policy, error) {
	for _, l := range []struct {
		what string
		n    int
	}{{"add_allow", len(e.AddAllow)}, {"remove_allow", len(e.RemoveAllow)}, {"add_deny", len(e.AddDeny)}, {"remove_deny", len(e.RemoveDeny)}} {
		if l.n > MaxPolicyEntries {
			return Policy{}, errdefs.New(errdefs.InvalidArgument, "too many %s rules (%d): a policy holds at most %d", l.what, l.n, MaxPolicyEntries)
		}
	}
	cur, err := p.Check()
	if err != nil {
		return Policy{}, err
	}
	_, ch, err := Policy{Allow: slices.Concat(e.AddAllow, e.RemoveAllow), Deny: slices.Concat(e.AddDeny, e.RemoveDeny)}.compileUnlimited()
	if err != nil {
		return Policy{}, err
	}
	addAllow, removeAllow := ch.Allow[:len(e.AddAllow)], ch.Allow[len(e.AddAllow):]
	addDeny, removeDeny := ch.Deny[:len(e.AddDeny)], ch.Deny[len(e.AddDeny):]
	out := Policy{Egress: cur.Egress, Allow: edit(cur.Allow, addAllow, removeAllow), Deny: edit(cur.Deny, addDeny, removeDeny)}
	if e.Egress != "" {
		out.Egress = e.Egress
	}
	return out.Check()
}

// edit returns list without the entries of remove, then with those of add
// it does not hold yet, in order.
func edit(list, add, remove []string) []string {
	var out []string
	for _, x := range list {
		if !slices.Contains(remove, x) {
			out = append(out, x)
		}
	}
	for _, x := range add {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
