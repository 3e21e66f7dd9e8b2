package network

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The nftables model: one inet table named by the prefix holds everything.
//
//	prerouting (nat):  per slot: from its veth to the resolver address -> dnat to its gateway
//	input (filter):    from any slot veth: established ok; per slot: to its own gateway -> chain dns
//	                   (udp/tcp 53 only); everything else from a slot veth is dropped, so no host
//	                   address, host loopback or daemon port is reachable
//	forward (filter):  per slot: from its veth -> chain s<k> (its policy); from an unknown slot veth
//	                   drop; into slot veths only established traffic (nobody dials a sandbox
//	                   through the host's routing)
//	postrouting (nat): from the range out of any non-slot interface -> masquerade
//
// Chain s<k> (rebuilt whole, atomically, on every policy change):
//
//	not IPv4 -> drop; source not the slot's address -> drop; established -> accept;
//	always-closed destinations (the clade range, loopback, link-local, multicast, reserved) -> drop;
//	deny CIDRs -> drop; allow CIDRs -> accept; private ranges -> drop; @d<k> (addresses allowed
//	names resolved to) -> accept; then accept (egress allow without an allowlist) or drop.
//
// Private ranges are closed before the resolved addresses: only a CIDR rule opens them, never a
// name, whose answer the sandbox may control (DNS rebinding into the host's LAN).

// alwaysClosed are destinations no policy opens (besides the clade range).
var alwaysClosed = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata 169.254.169.254
	netip.MustParsePrefix("224.0.0.0/3"),    // multicast, reserved, broadcast
}

// privateRanges are closed unless an allow CIDR rule opens them.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

const (
	chainInput       = "input"
	chainForward     = "forward"
	chainPrerouting  = "prerouting"
	chainPostrouting = "postrouting"
	chainDNS         = "dns"
	chainRefuse      = "refuse"
)

// nftBuffer is the size of the netlink socket buffers of an nftables
// batch. The kernel echoes every rule of a batch back; past the default
// buffer (~200 KiB; a policy of 2*MaxPolicyEntries rules overflowed it)
// the replies are lost (ENOBUFS) after the batch was committed, and the
// sender cannot tell what happened.
const nftBuffer = 16 << 20

// newConn opens an nftables connection whose socket buffers hold the
// replies of the largest batch a policy makes (set by force, beyond the
// rmem_max and wmem_max sysctls: the daemon is root).
func newConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *mnl.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftBuffer),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, nftBuffer))
		})
		return errors.Join(err, serr)
	}))
}

type ruleset struct {
	table  *nftables.Table
	prefix string // interface name prefix, "<prefix>-"
	rng    netip.Prefix
}

func (rs *ruleset) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: rs.table}
}

func slotChain(k int) string { return "s" + strconv.Itoa(k) }
func slotSet(k int) string   { return "d" + strconv.Itoa(k) }
func slotTag(k int) []byte   { return []byte("clade-slot:" + strconv.Itoa(k)) }

func (rs *ruleset) dnsSet(k int) *nftables.Set {
	return &nftables.Set{Table: rs.table, Name: slotSet(k), KeyType: nftables.TypeIPAddr, HasTimeout: true}
}

// base queues the table, its base chains and their shared rules.
func (rs *ruleset) base(c *nftables.Conn) {
	c.AddTable(rs.table)
	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: chainInput, Table: rs.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: rs.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddChain(&nftables.Chain{Name: chainPrerouting, Table: rs.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: chainPostrouting, Table: rs.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	dns := c.AddChain(&nftables.Chain{Name: chainDNS, Table: rs.table})
	// refuse answers at once (TCP reset, else ICMP administratively
	// prohibited), so a program fails fast and clearly instead of hanging.
	refuse := c.AddChain(&nftables.Chain{Name: chainRefuse, Table: rs.table})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: refuse, Exprs: cat(l4proto(unix.IPPROTO_TCP),
		[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: refuse, Exprs: []expr.Any{
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}})

	// input: replies to the host's own connections into sandboxes (ingress,
	// Dial) pass; a slot's resolver is reached by per-slot rules inserted
	// before the final drop.
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: in, Exprs: cat(ifname(expr.MetaKeyIIFNAME, rs.prefix, true), established(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: in, Exprs: cat(ifname(expr.MetaKeyIIFNAME, rs.prefix, true), refuseIt())})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: rs.table, Chain: dns, Exprs: cat(l4proto(proto), dport(53), verdict(expr.VerdictAccept))})
	}

	// forward: per-slot jumps are inserted at the head; a slot veth with no
	// chain (being built or torn down) gets nothing through.
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: fwd, Exprs: cat(ifname(expr.MetaKeyIIFNAME, rs.prefix, true), verdict(expr.VerdictDrop))})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: fwd, Exprs: cat(ifname(expr.MetaKeyOIFNAME, rs.prefix, true), established(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: fwd, Exprs: cat(ifname(expr.MetaKeyOIFNAME, rs.prefix, true), verdict(expr.VerdictDrop))})

	// postrouting: sandboxes leave the host with the host's address.
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: post, Exprs: cat(ipv4(), addrIn(12, rs.rng, false),
		ifnameNot(expr.MetaKeyOIFNAME, rs.prefix), []expr.Any{&expr.Masq{}})})
}

// addSlot queues slot k's chain, set and base-chain rules; its policy
// chain starts closed.
func (rs *ruleset) addSlot(c *nftables.Conn, s *Slot) error {
	k := s.Index
	c.AddChain(rs.chain(slotChain(k)))
	if err := c.AddSet(rs.dnsSet(k), nil); err != nil {
		return err
	}
	tag := slotTag(k)
	iface := ifname(expr.MetaKeyIIFNAME, s.Iface, false)
	c.InsertRule(&nftables.Rule{Table: rs.table, Chain: rs.chain(chainInput), UserData: tag,
		Exprs: cat(iface, ipv4(), addrIn(12, netip.PrefixFrom(s.Addr, 32), false), addrIn(16, netip.PrefixFrom(s.Gateway, 32), false), jump(chainDNS))})
	c.InsertRule(&nftables.Rule{Table: rs.table, Chain: rs.chain(chainForward), UserData: tag,
		Exprs: cat(iface, jump(slotChain(k)))})
	c.AddRule(&nftables.Rule{Table: rs.table, Chain: rs.chain(chainPrerouting), UserData: tag,
		Exprs: cat(iface, ipv4(), addrIn(16, netip.PrefixFrom(s.Resolver, 32), false),
			[]expr.Any{&expr.Immediate{Register: 1, Data: s.Gateway.AsSlice()},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}})})
	rs.policy(c, s, nil)
	return nil
}

// policy queues slot s's policy chain, rebuilt whole; r nil closes it.
// The resolved-address set is emptied: what names a former policy allowed
// resolved to is no longer allowed.
func (rs *ruleset) policy(c *nftables.Conn, s *Slot, r *rules) {
	ch := rs.chain(slotChain(s.Index))
	c.FlushChain(ch)
	c.FlushSet(rs.dnsSet(s.Index))
	add := func(e ...[]expr.Any) { c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch, Exprs: cat(e...)}) }
	drop, accept := refuseIt(), verdict(expr.VerdictAccept)
	add(ipv4Not(), verdict(expr.VerdictDrop))
	add(addrIn(12, netip.PrefixFrom(s.Addr, 32), true), verdict(expr.VerdictDrop))
	add(established(), accept)
	if r == nil {
		add(drop)
		return
	}
	for _, p := range append([]netip.Prefix{rs.rng}, alwaysClosed...) {
		add(addrIn(16, p, false), drop)
	}
	for _, p := range r.denyCIDRs {
		add(addrIn(16, p, false), drop)
	}
	for _, p := range r.allowCIDRs {
		add(addrIn(16, p, false), accept)
	}
	for _, p := range privateRanges {
		add(addrIn(16, p, false), drop)
	}
	if len(r.hosts)+len(r.domains) > 0 {
		add(daddr(), []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: slotSet(s.Index)}}, accept)
	}
	if r.allowAll {
		add(accept)
	} else {
		add(drop)
	}
}

// allowAddrs queues addresses an allowed name resolved to, for ttl.
func (rs *ruleset) allowAddrs(c *nftables.Conn, k int, addrs []netip.Addr, ttl time.Duration) error {
	els := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		els = append(els, nftables.SetElement{Key: a.AsSlice(), Timeout: ttl})
	}
	return c.SetAddElements(rs.dnsSet(k), els)
}

// removeSlot queues the removal of everything of slot k in the table.
func (rs *ruleset) removeSlot(c *nftables.Conn, k int) error {
	tag := slotTag(k)
	for _, name := range []string{chainInput, chainForward, chainPrerouting} {
		rules, err := c.GetRules(rs.table, rs.chain(name))
		if err != nil {
			return fmt.Errorf("list %s rules: %w", name, err)
		}
		for _, r := range rules {
			if bytes.Equal(r.UserData, tag) {
				if err := c.DelRule(r); err != nil {
					return err
				}
			}
		}
	}
	c.FlushChain(rs.chain(slotChain(k)))
	c.DelChain(rs.chain(slotChain(k)))
	c.DelSet(rs.dnsSet(k))
	return nil
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifname matches an interface name, or with prefix set, names that start
// with name.
func ifname(key expr.MetaKey, name string, prefix bool) []expr.Any {
	data := []byte(name)
	if !prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

func ifnameNot(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(prefix)}}
}

func ipv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

func ipv4Not() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

func daddr() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
}

// addrIn matches the IPv4 address at offset (12 source, 16 destination)
// against p; with not set, it matches addresses outside p.
func addrIn(offset uint32, p netip.Prefix, not bool) []expr.Any {
	mask := make([]byte, 4)
	bits := p.Bits()
	for i := range 4 {
		switch {
		case bits >= 8:
			mask[i] = 0xff
			bits -= 8
		case bits > 0:
			mask[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	op := expr.CmpOpEq
	if not {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func refuseIt() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse}}
}

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}
