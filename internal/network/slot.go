package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where clade pins its network namespaces (enter one with
// `nsenter --net=/run/clade-netns/NAME`). Not /run/netns: `ip netns add`
// bind-mounts /run/netns over itself when it is not a mount point yet,
// which hides the namespace mounts already there; hidden, they can be
// neither used nor removed, and a daemon could not clean up after itself
// (seen when an operator ran `ip netns add` beside a running daemon).
const NetNSDir = "/run/clade-netns"

// guestIface is the sandbox-side veth's name inside its namespace.
const guestIface = "eth0"

// Slot is one sandbox network: a namespace with a veth to the host and a
// /30 of the range.
type Slot struct {
	// Index numbers the slot in the range; names derive from it.
	Index int
	// NetNS is the path of the slot's network namespace.
	NetNS string
	// Iface is the host side of the veth pair.
	Iface string
	// Addr is the sandbox's address, Gateway the host side's.
	Addr    netip.Addr
	Gateway netip.Addr
	// Resolver is the address of the sandbox's DNS resolver (the same for
	// every slot, so a restored copy of a sandbox keeps a working
	// /etc/resolv.conf).
	Resolver netip.Addr
}

// plan maps slot indexes to names and addresses.
type plan struct {
	prefix string // e.g. "clade"; names are "<prefix>-<k>"
	rng    netip.Prefix
}

// slots returns how many slots the range holds: one /30 each, the last
// /30 kept for the resolver address.
func (p plan) slots() int { return 1<<(32-p.rng.Bits())/4 - 1 }

func (p plan) name(k int) string { return p.prefix + "-" + strconv.Itoa(k) }

// index parses a name made by name; ok is false for anything else.
func (p plan) index(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, p.prefix+"-")
	if !ok || rest == "" {
		return 0, false
	}
	k, err := strconv.Atoi(rest)
	if err != nil || k < 0 || strconv.Itoa(k) != rest {
		return 0, false
	}
	return k, true
}

func (p plan) addr(offset int) netip.Addr {
	b := p.rng.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(offset)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (p plan) resolver() netip.Addr { return p.addr(p.slots()*4 + 2) }

func (p plan) slot(k int) *Slot {
	return &Slot{Index: k, NetNS: filepath.Join(NetNSDir, p.name(k)), Iface: p.name(k),
		Gateway: p.addr(4*k + 1), Addr: p.addr(4*k + 2), Resolver: p.resolver()}
}

// build makes slot s's namespace and veth pair, with addresses, links up
// and the sandbox's default route via the host side. On error whatever it
// made is removed.
func build(s *Slot) (err error) {
	defer func() {
		if err != nil {
			err = errors.Join(err, teardown(s))
		}
	}()
	if err := NewNetNS(s.NetNS); err != nil {
		return fmt.Errorf("netns %s: %w", s.NetNS, err)
	}
	fd, err := unix.Open(s.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	la := netlink.NewLinkAttrs()
	la.Name = s.Iface
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: guestIface, PeerNamespace: netlink.NsFd(fd)}); err != nil {
		return fmt.Errorf("veth %s: %w", s.Iface, err)
	}
	host, err := netlink.LinkByName(s.Iface)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(s.Gateway, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", s.Gateway, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(fd))
	if err != nil {
		return err
	}
	defer h.Close()
	guest, err := h.LinkByName(guestIface)
	if err != nil {
		return err
	}
	if err := h.AddrAdd(guest, &netlink.Addr{IPNet: ipnet(s.Addr, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", s.Addr, err)
	}
	if err := h.LinkSetUp(guest); err != nil {
		return err
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: guest.Attrs().Index, Gw: s.Gateway.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// teardown removes slot s's veth pair and namespace. Missing parts are
// not an error.
func teardown(s *Slot) error {
	var errs []error
	if l, err := netlink.LinkByName(s.Iface); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", s.Iface, err))
		}
	}
	if err := unix.Unmount(s.NetNS, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		errs = append(errs, fmt.Errorf("unmount %s: %w", s.NetNS, err))
	}
	if err := os.Remove(s.NetNS); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// NewNetNS makes a network namespace and pins it at path. The namespace is
// made on a thread of its own that dies afterwards, so no goroutine ever
// runs in the wrong namespace.
func NewNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// forgetFlows deletes the host's connection tracking entries of flows from
// or to address a (original direction), so no packet of them passes as
// established any more: the next one is judged by the rules as new.
func forgetFlows(a netip.Addr) error {
	from, to := &netlink.ConntrackFilter{}, &netlink.ConntrackFilter{}
	if err := from.AddIP(netlink.ConntrackOrigSrcIP, a.AsSlice()); err != nil {
		return err
	}
	if err := to.AddIP(netlink.ConntrackOrigDstIP, a.AsSlice()); err != nil {
		return err
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, from, to); err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	return nil
}
