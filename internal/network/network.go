// Package network gives every sandbox a network of its own: a network
// namespace with a veth pair to the host and a /30 of a private range,
// taken from a pool built ahead so a create pays almost nothing for it.
// Egress is enforced on the host side in one nftables table, where the
// sandbox cannot touch it; a small DNS forwarder per slot answers the
// sandbox's lookups and lets hostname allow rules hold for the addresses
// the names resolved to.
//
// Every resource is named from Config.Prefix (namespaces /run/clade-netns/<prefix>-<k>,
// host veths <prefix>-<k>, the nftables table <prefix>), so Reclaim can find
// and free whatever a killed daemon left.
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// DefaultRange is the default address range: unlikely to clash with a
// host's own networks (cloud VPCs favour 10.0/16 and 172.31/16, home
// routers 192.168/16).
var DefaultRange = netip.MustParsePrefix("10.200.0.0/16")

// Config configures a Network.
type Config struct {
	// StateDir records which sandbox owns which slot, so a restarted
	// daemon knows.
	StateDir string
	// Range is the IPv4 range slots take their /30s from; DefaultRange if
	// zero. Its last /30 holds the resolver address.
	Range netip.Prefix
	// Prefix names every resource: "clade" if empty; letters and digits,
	// at most 9 so interface names fit.
	Prefix string
	// PoolSize is how many slots are kept built ahead; 8 if zero, none if
	// negative.
	PoolSize int
	// Upstreams are the DNS servers (host:port) the sandboxes' resolver
	// forwards to; the nameservers of ResolvConf if empty. NoUpstream makes
	// it answer SERVFAIL to everything instead.
	Upstreams  []string
	ResolvConf string
	NoUpstream bool
	Log        *slog.Logger
}

// Network owns the slots of one daemon.
type Network struct {
	cfg  Config
	plan plan
	rs   *ruleset
	dns  *forwarder

	nftMu sync.Mutex // one nftables batch at a time

	mu      sync.Mutex
	held    map[string]*held // by owner
	free    []*Slot          // built, owned by nobody
	used    map[int]bool     // indexes built or being built
	next    int              // where make looks for a free index first
	closed  bool
	kick    chan struct{}
	stop    chan struct{}
	filling sync.WaitGroup
	claim   *os.File // holds the prefix and range for this daemon (claim.go)
}

type held struct {
	slot   *Slot
	owner  string
	policy *rules
}

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,8}$`)

// New checks cfg, enables IPv4 forwarding (see forward.go), takes stock of what a previous
// daemon left (slots with a recorded owner stay held, unowned ones are
// removed), rebuilds the nftables table (held slots closed until Reclaim
// or SetPolicy gives them their policy) and starts filling the pool.
func New(ctx context.Context, cfg Config) (*Network, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if !cfg.Range.IsValid() {
		cfg.Range = DefaultRange
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "clade"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 8
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	if !prefixRE.MatchString(cfg.Prefix) {
		return nil, errdefs.New(errdefs.InvalidArgument, "bad network prefix %q: use 1-9 lower-case letters and digits, starting with a letter", cfg.Prefix)
	}
	if !cfg.Range.Addr().Is4() || cfg.Range.Bits() > 29 {
		return nil, errdefs.New(errdefs.InvalidArgument, "bad network range %s: use an IPv4 CIDR of /29 or larger, e.g. %s", cfg.Range, DefaultRange)
	}
	cfg.Range = cfg.Range.Masked()
	if cfg.StateDir == "" {
		return nil, errors.New("network: no state dir")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	claim, err := claimPrefix(cfg.Prefix, cfg.Range)
	if err != nil {
		return nil, err
	}
	if err := enableForwarding(cfg.Prefix); err != nil {
		claim.Close()
		return nil, err
	}
	p := plan{prefix: cfg.Prefix, rng: cfg.Range}
	n := &Network{cfg: cfg, plan: p, held: map[string]*held{}, used: map[int]bool{}, claim: claim,
		rs:   &ruleset{table: &nftables.Table{Name: cfg.Prefix, Family: nftables.TableFamilyINet}, prefix: cfg.Prefix + "-", rng: cfg.Range},
		kick: make(chan struct{}, 1), stop: make(chan struct{})}
	upstreams := cfg.Upstreams
	if len(upstreams) == 0 && !cfg.NoUpstream {
		upstreams = readResolvConf(cfg.ResolvConf)
	}
	if cfg.NoUpstream {
		upstreams = nil
	}
	n.dns = newForwarder(n, upstreams, cfg.Log)
	if err := n.adopt(); err != nil {
		n.dns.shutdown()
		claim.Close()
		return nil, err
	}
	if err := n.rebuild(); err != nil {
		n.dns.shutdown()
		claim.Close()
		return nil, err
	}
	n.filling.Add(1)
	go n.fill()
	return n, nil
}

func (n *Network) ownerFile(k int) string {
	return filepath.Join(n.cfg.StateDir, strconv.Itoa(k))
}

// adopt takes stock of the slots on the machine: recorded owners keep
// theirs, the rest are removed. A slot that cannot be removed is left
// alone and its index never used, so the daemon still starts.
func (n *Network) adopt() error {
	found := map[int]bool{}
	if ents, err := os.ReadDir(NetNSDir); err == nil {
		for _, e := range ents {
			if k, ok := n.plan.index(e.Name()); ok {
				found[k] = true
			}
		}
	}
	links, err := linkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if k, ok := n.plan.index(l.Attrs().Name); ok {
			found[k] = true
		}
	}
	owners := map[int]string{}
	ents, _ := os.ReadDir(n.cfg.StateDir)
	for _, e := range ents {
		k, err := strconv.Atoi(e.Name())
		b, rerr := os.ReadFile(filepath.Join(n.cfg.StateDir, e.Name()))
		if err != nil || rerr != nil || !found[k] || k >= n.plan.slots() {
			os.Remove(filepath.Join(n.cfg.StateDir, e.Name()))
			continue
		}
		owners[k] = strings.TrimSpace(string(b))
	}
	for k := range found {
		s := n.plan.slot(k)
		owner, ok := owners[k]
		if ok && owner != "" && k < n.plan.slots() && isWhole(s) {
			if err := n.dns.serve(s); err == nil {
				n.held[owner] = &held{slot: s, owner: owner}
				n.used[k] = true
				continue
			}
		}
		n.cfg.Log.Info("network: removing a slot nobody owns", "slot", k)
		os.Remove(n.ownerFile(k))
		if err := teardown(s); err != nil {
			n.cfg.Log.Warn("network: cannot remove a slot nobody owns; its index stays unused until it can", "slot", k, "err", err)
			n.used[k] = true
		}
	}
	return nil
}

// isWhole reports whether slot s's namespace and host veth (with its
// address) exist.
func isWhole(s *Slot) bool {
	if _, err := os.Stat(s.NetNS); err != nil {
		return false
	}
	l, err := netlink.LinkByName(s.Iface)
	if err != nil {
		return false
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if a.IP.Equal(s.Gateway.AsSlice()) {
			return true
		}
	}
	return false
}

// rebuild replaces the whole nftables table, atomically, with one for the
// slots n knows.
func (n *Network) rebuild() error {
	n.nftMu.Lock()
	defer n.nftMu.Unlock()
	c, err := newConn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if t, _ := c.ListTableOfFamily(n.rs.table.Name, n.rs.table.Family); t != nil {
		c.DelTable(n.rs.table)
	}
	n.rs.base(c)
	n.mu.Lock()
	for _, h := range n.held {
		if err := n.rs.addSlot(c, h.slot); err != nil {
			n.mu.Unlock()
			return err
		}
		if h.policy != nil {
			n.rs.policy(c, h.slot, h.policy)
		}
	}
	for _, s := range n.free {
		if err := n.rs.addSlot(c, s); err != nil {
			n.mu.Unlock()
			return err
		}
	}
	n.mu.Unlock()
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", n.rs.table.Name, err)
	}
	return nil
}

// flush runs one nftables batch queued by queue.
func (n *Network) flush(queue func(c *nftables.Conn) error) error {
	n.nftMu.Lock()
	defer n.nftMu.Unlock()
	c, err := newConn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := queue(c); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

// fill keeps PoolSize slots built ahead until Close.
func (n *Network) fill() {
	defer n.filling.Done()
	for {
		n.mu.Lock()
		want := !n.closed && len(n.free) < n.cfg.PoolSize
		n.mu.Unlock()
		if !want {
			select {
			case <-n.stop:
				return
			case <-n.kick:
				continue
			}
		}
		s, err := n.make()
		if err != nil {
			n.cfg.Log.Warn("network: building a slot failed", "err", err)
			select {
			case <-n.stop:
				return
			case <-time.After(5 * time.Second): // do not spin on a persistent failure
			}
			continue
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			_ = n.remove(s)
			return
		}
		n.free = append(n.free, s)
		n.mu.Unlock()
	}
}

// make builds a new slot at the next free index after the one it built
// last, so a freed index (and its address) is taken again only after every
// other free one: flows of its former owner still in flight meet nobody.
func (n *Network) make() (*Slot, error) {
	n.mu.Lock()
	k := -1
	for i := range n.plan.slots() {
		if j := (n.next + i) % n.plan.slots(); !n.used[j] {
			k = j
			break
		}
	}
	if k < 0 {
		n.mu.Unlock()
		return nil, errdefs.New(errdefs.ResourceExhausted, "network range %s is full (%d sandboxes): remove some or use a larger --network-range", n.cfg.Range, n.plan.slots())
	}
	n.used[k] = true
	n.next = (k + 1) % n.plan.slots()
	n.mu.Unlock()
	s := n.plan.slot(k)
	err := build(s)
	if err == nil {
		err = n.flush(func(c *nftables.Conn) error { return n.rs.addSlot(c, s) })
		if err == nil {
			err = n.dns.serve(s)
		}
		if err == nil {
			// The host may still track flows of the address's former
			// owner (remove forgets them, but may have failed, or a
			// killed daemon never ran it); the slot chain accepts
			// established flows before any policy rule, so they would go
			// on under the new owner's policy. Nothing in the new slot
			// runs yet, and nothing from outside can start a flow into it
			// (the forward chain drops that), so none appears before the
			// slot is handed out.
			if ferr := forgetFlows(s.Addr); ferr != nil {
				err = fmt.Errorf("forget the flows of %s: %w", s.Addr, ferr)
			}
		}
		if err != nil {
			err = errors.Join(err, n.remove(s))
		}
	}
	if err != nil {
		n.mu.Lock()
		delete(n.used, k)
		n.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// remove takes slot s off the machine: resolver, rules, veth, namespace,
// and the host's connection tracking of its address (best effort: make
// forgets them again before the address has a new owner).
func (n *Network) remove(s *Slot) error {
	n.dns.close(s.Index)
	err := n.flush(func(c *nftables.Conn) error { return n.rs.removeSlot(c, s.Index) })
	if err != nil && errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	err = errors.Join(err, teardown(s))
	if ferr := forgetFlows(s.Addr); ferr != nil {
		n.cfg.Log.Warn("network: forgetting the flows of a removed slot failed", "slot", s.Index, "err", ferr)
	}
	if err == nil {
		n.mu.Lock()
		delete(n.used, s.Index)
		n.mu.Unlock()
	}
	return err
}

// Acquire returns the slot owner holds, giving it one (from the pool, or
// built now if the pool is empty) if it holds none, and applies p to it.
// It is idempotent for one owner. Errors: InvalidArgument for a bad
// policy, ResourceExhausted when the range is full.
func (n *Network) Acquire(ctx context.Context, owner string, p Policy) (Slot, error) {
	r, _, err := p.compile()
	if err != nil {
		return Slot{}, err
	}
	if owner == "" || strings.ContainsAny(owner, "/\n") {
		return Slot{}, errdefs.New(errdefs.InvalidArgument, "bad slot owner %q", owner)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return Slot{}, errdefs.New(errdefs.Unavailable, "network is closed")
	}
	h := n.held[owner]
	if h != nil && h.policy.equal(r) {
		// Held with these rules already (a hot sandbox claimed with the
		// policy it started with): its owner file and nftables rules are
		// in place, and a claim pays no netlink batch.
		s := *h.slot
		n.mu.Unlock()
		return s, nil
	}
	if h == nil && len(n.free) > 0 {
		s := n.free[0] // the oldest: see make
		n.free = n.free[1:]
		h = &held{slot: s, owner: owner}
		n.held[owner] = h
	}
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
	if h == nil {
		s, err := n.make()
		if err != nil {
			return Slot{}, err
		}
		n.mu.Lock()
		if other := n.held[owner]; other != nil { // a racing Acquire for the same owner won
			n.free = append(n.free, s)
			h = other
		} else {
			h = &held{slot: s, owner: owner}
			n.held[owner] = h
		}
		n.mu.Unlock()
	}
	if err := os.WriteFile(n.ownerFile(h.slot.Index), []byte(owner), 0o600); err != nil {
		return Slot{}, errors.Join(err, n.Release(ctx, owner))
	}
	if err := n.apply(h, r); err != nil {
		return Slot{}, errors.Join(err, n.Release(ctx, owner))
	}
	return *h.slot, nil
}

// apply gives h's slot the rules r; h keeps its former rules (in the
// nftables table and for the resolver) if the kernel refuses them.
func (n *Network) apply(h *held, r *rules) error {
	n.nftMu.Lock()
	defer n.nftMu.Unlock()
	c, err := newConn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	n.rs.policy(c, h.slot, r)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	// Under nftMu: the resolver adds addresses for the policy it checked
	// only while that policy is still the slot's (see forwarder.handle).
	n.mu.Lock()
	h.policy = r
	n.mu.Unlock()
	return nil
}

// SetPolicy replaces the policy of the slot owner holds; new connections
// follow p at once. When p only widens the old policy (adds allow rules,
// drops deny rules, opens egress) established connections go on;
// otherwise the host forgets the slot's connection tracking, so the next
// packet of every connection is judged by p as if it were new: those p
// forbids are cut (refused), the others go on, except that connections
// to addresses allowed names resolved to need the name resolved again.
// Errors: InvalidArgument for a bad policy, NotFound when owner holds no
// slot.
func (n *Network) SetPolicy(ctx context.Context, owner string, p Policy) error {
	r, _, err := p.compile()
	if err != nil {
		return err
	}
	return n.setRules(owner, r)
}

func (n *Network) setRules(owner string, r *rules) error {
	n.mu.Lock()
	h := n.held[owner]
	var old *rules
	if h != nil {
		old = h.policy
	}
	n.mu.Unlock()
	if h == nil {
		return errdefs.New(errdefs.NotFound, "%s holds no network slot", owner)
	}
	if err := n.apply(h, r); err != nil {
		return err
	}
	if !r.widens(old) {
		if err := forgetFlows(h.slot.Addr); err != nil {
			return fmt.Errorf("cut the connections the new policy of %s forbids: %w", owner, err)
		}
	}
	return nil
}

// Lookup returns the slot owner holds.
func (n *Network) Lookup(owner string) (Slot, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h := n.held[owner]; h != nil {
		return *h.slot, true
	}
	return Slot{}, false
}

// Dial connects from the host to port inside the sandbox owner's slot
// (over its veth; the host's own connections are not filtered). Errors:
// NotFound when owner holds no slot.
func (n *Network) Dial(ctx context.Context, owner string, port int) (net.Conn, error) {
	s, ok := n.Lookup(owner)
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "%s holds no network slot", owner)
	}
	// Bounded: a sandbox whose network stack does not answer (it never
	// takes more than milliseconds when it works) must not hold the
	// caller for the kernel's two minutes of SYN retries; the ingress then
	// tries the agent's way.
	d := net.Dialer{Timeout: dialTimeout}
	return d.DialContext(ctx, "tcp4", netip.AddrPortFrom(s.Addr, uint16(port)).String())
}

// dialTimeout bounds Dial's connect.
const dialTimeout = 3 * time.Second

// Release frees the slot owner holds: the namespace, veth, rules and
// resolver are removed (a slot is never handed out twice; the pool builds
// fresh ones). Releasing what owner does not hold returns nil.
func (n *Network) Release(ctx context.Context, owner string) error {
	n.mu.Lock()
	h := n.held[owner]
	delete(n.held, owner)
	n.mu.Unlock()
	if h == nil {
		return nil
	}
	os.Remove(n.ownerFile(h.slot.Index))
	if err := n.remove(h.slot); err != nil {
		return fmt.Errorf("release network of %s: %w", owner, err)
	}
	return nil
}

// Reclaim frees every slot not held by an owner in keep and applies keep's
// policies to the rest; after a daemon was killed it leaves only what the
// kept sandboxes use. It is idempotent.
func (n *Network) Reclaim(ctx context.Context, keep map[string]Policy) error {
	n.mu.Lock()
	var drop []string
	for owner := range n.held {
		if _, ok := keep[owner]; !ok {
			drop = append(drop, owner)
		}
	}
	n.mu.Unlock()
	var errs []error
	for _, owner := range drop {
		n.cfg.Log.Info("network: reclaiming the slot of a sandbox that is gone", "owner", owner)
		errs = append(errs, n.Release(ctx, owner))
	}
	for owner, p := range keep {
		r, _, err := p.compile()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, ok := n.Lookup(owner); ok {
			errs = append(errs, n.setRules(owner, r))
		}
	}
	return errors.Join(errs...)
}

// Close stops the pool and the resolvers and removes the slots nobody
// holds; held slots stay for the sandboxes that keep running, and with
// none held the nftables table goes too.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	close(n.stop)
	n.mu.Unlock()
	n.filling.Wait()
	n.mu.Lock()
	free := n.free
	n.free = nil
	nheld := len(n.held)
	n.mu.Unlock()
	var errs []error
	for _, s := range free {
		errs = append(errs, n.remove(s))
	}
	n.dns.shutdown()
	if nheld == 0 {
		err := n.flush(func(c *nftables.Conn) error {
			if t, _ := c.ListTableOfFamily(n.rs.table.Name, n.rs.table.Family); t != nil {
				c.DelTable(n.rs.table)
			}
			return nil
		})
		if err == nil {
			err = releaseForwarding(n.cfg.Prefix)
		}
		errs = append(errs, err)
	}
	n.claim.Close() // last: the table is gone, another daemon may take the prefix
	return errors.Join(errs...)
}

// Stats says how many slots are held and built ahead.
func (n *Network) Stats() (held, free int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.held), len(n.free)
}

// policyOf returns the rules of slot k, or nil.
func (n *Network) policyOf(k int) *rules {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, h := range n.held {
		if h.slot.Index == k {
			return h.policy
		}
	}
	return nil
}

// Resources lists what a network with prefix holds on the machine
// (namespaces, links, the nftables table), for leak checks.
func Resources(prefix string) []string {
	p := plan{prefix: prefix}
	var out []string
	if ents, err := os.ReadDir(NetNSDir); err == nil {
		for _, e := range ents {
			if _, ok := p.index(e.Name()); ok {
				out = append(out, "netns: "+e.Name())
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if _, ok := p.index(l.Attrs().Name); ok {
				out = append(out, "link: "+l.Attrs().Name)
			}
		}
	}
	if c, err := newConn(); err == nil {
		if t, _ := c.ListTableOfFamily(prefix, nftables.TableFamilyINet); t != nil {
			out = append(out, "nftables table: inet "+prefix)
		}
	}
	return out
}

// RemoveResources removes what Resources lists for prefix: the leftovers
// of a daemon that was killed and never started again (a failed test
// run), which its next start would otherwise have taken back. Only for a
// prefix no running daemon uses.
func RemoveResources(prefix string) error {
	p := plan{prefix: prefix}
	var errs []error
	if ents, err := os.ReadDir(NetNSDir); err == nil {
		for _, e := range ents {
			if _, ok := p.index(e.Name()); ok {
				errs = append(errs, teardown(&Slot{NetNS: filepath.Join(NetNSDir, e.Name())}))
			}
		}
	}
	if links, err := linkList(); err == nil {
		for _, l := range links {
			if _, ok := p.index(l.Attrs().Name); ok {
				errs = append(errs, netlink.LinkDel(l))
			}
		}
	}
	c, err := newConn()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if t, _ := c.ListTableOfFamily(prefix, nftables.TableFamilyINet); t != nil {
		c.DelTable(t)
		errs = append(errs, c.Flush())
	}
	return errors.Join(append(errs, releaseForwarding(prefix))...)
}

// linkList lists the host's links, again when the kernel says the dump was
// interrupted by a change under it (links come and go as sandboxes do).
func linkList() ([]netlink.Link, error) {
	for try := 0; ; try++ {
		links, err := netlink.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == 4 {
			return links, err
		}
	}
}
