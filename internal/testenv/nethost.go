package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetPlan is the network share one test gets: its own slot prefix and
// range (so tests in parallel processes never share names or addresses)
// and the addresses of its test host. Tests send traffic only to loopback
// and to test hosts like these, which live in namespaces the test makes.
type NetPlan struct {
	// Prefix and Range are for the daemon's --network-prefix and
	// --network-range.
	Prefix string
	Range  netip.Prefix
	// HostNet is the /29 of the test host's veth: .1 on the host side,
	// .2 and .3 on the test host. It lies in 198.18.0.0/15 (reserved for
	// benchmarks, routed nowhere), outside the private ranges: names
	// resolving into it can be allowed, and egress allow reaches it.
	HostNet netip.Prefix
	// PrivateNet is a second /29 on the same veth, in 10/8, a private
	// range: a sandbox reaches it only when a CIDR rule allows it.
	PrivateNet netip.Prefix
	index      int
	lock       *netLock
}

// netLock is a share's lock file, held until the end of the test that
// took it.
type netLock struct {
	f        *os.File
	released atomic.Bool
}

// Held reports whether the test still holds the share: false once the
// cleanup ReserveNet registered has run (cleanups run last registered
// first, so a cleanup registered before ReserveNet runs after that one:
// it must not remove the share's resources, which another test may have
// taken meanwhile).
func (p NetPlan) Held() bool { return p.lock != nil && !p.lock.released.Load() }

// ReserveNet takes a free network share for the test (a lock file held
// until the test ends) and checks no leftover of it exists. A test whose
// own cleanup removes the share's leftovers takes the share before it
// registers that cleanup (and gives it to its daemon: StartDaemonOn), so
// that the share is held until that cleanup has run.
func ReserveNet(t testing.TB) NetPlan {
	t.Helper()
	RequireRoot(t)
	dir := "/run/clade-testnet"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 250 {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		if inUse, _ := filepath.Glob(filepath.Join(network.NetNSDir, fmt.Sprintf("ct%d-*", i))); len(inUse) > 0 {
			// A daemon whose test died without it (another tree's,
			// perhaps) still holds the share: a daemon given it would
			// refuse to start.
			f.Close()
			continue
		}
		// Links or an nftables table of the prefix with no daemon using it
		// are a leftover of an earlier run (a test binary killed at its
		// timeout, a daemon stopped with sandboxes that a later run
		// removed): a daemon started on the share in the host's namespace
		// takes them back, but one in a namespace of the test's (a cluster
		// node) never sees them, and the leak census would blame its test.
		if left := network.Resources(fmt.Sprintf("ct%d", i)); len(left) > 0 {
			if err := network.RemoveResources(fmt.Sprintf("ct%d", i)); err != nil {
				f.Close()
				continue
			}
			t.Logf("network share ct%d: removed the leftovers of an earlier run: %s", i, strings.Join(left, ", "))
		}
		l := &netLock{f: f}
		t.Cleanup(func() {
			l.released.Store(true)
			f.Close()
		})
		return NetPlan{Prefix: fmt.Sprintf("ct%d", i), Range: netip.MustParsePrefix(fmt.Sprintf("10.201.%d.0/24", i)),
			HostNet:    netip.MustParsePrefix(fmt.Sprintf("198.18.%d.0/29", i)),
			PrivateNet: netip.MustParsePrefix(fmt.Sprintf("10.202.%d.0/29", i)), index: i, lock: l}
	}
	t.Fatal("no free test network share in /run/clade-testnet")
	return NetPlan{}
}

// DaemonArgs are the daemon flags for the plan.
func (p NetPlan) DaemonArgs() []string {
	return []string{"--network-prefix", p.Prefix, "--network-range", p.Range.String()}
}

// NetLeaks lists network resources of the plan's prefix still on the
// machine.
func (p NetPlan) NetLeaks() []string { return network.Resources(p.Prefix) }

// NetLeaksIn is NetLeaks for a daemon that ran in the network namespace
// ns: its links and nftables table are there, not in the host's.
func (p NetPlan) NetLeaksIn(ns string) []string {
	if ns == "" {
		return p.NetLeaks()
	}
	var out []string
	if err := InNetNS(ns, func() error { out = network.Resources(p.Prefix); return nil }); err != nil {
		return []string{fmt.Sprintf("network namespace %s: %v", ns, err)}
	}
	return out
}

// RemoveNetLeaks removes what NetLeaks lists (see network.RemoveResources).
func (p NetPlan) RemoveNetLeaks() error { return network.RemoveResources(p.Prefix) }

// TestHost is a machine the test makes: a network namespace with a veth to
// the host, serving HTTP on port 80 and DNS on port 53 of both addresses.
type TestHost struct {
	NS string
	// Addr and Addr2 are its addresses in HostNet, Private its address in
	// PrivateNet; HostSide the host's end of its veth (in HostNet).
	Addr, Addr2, Private, HostSide netip.Addr
	// DNS is Addr:53, for the daemon's --dns-upstream.
	DNS string
}

// StartTestHost makes the plan's test host. Its DNS server answers A
// queries for good.test (Addr), bad.test (Addr2) and private.test
// (Private), NXDOMAIN otherwise;
// its HTTP server answers "hello from ADDR" with the address it was
// reached on. Everything is removed at the end of the test.
func StartTestHost(t testing.TB, p NetPlan) *TestHost {
	t.Helper()
	at := func(pfx netip.Prefix, n byte) netip.Addr { b := pfx.Addr().As4(); b[3] += n; return netip.AddrFrom4(b) }
	h := &TestHost{NS: filepath.Join(network.NetNSDir, fmt.Sprintf("cth%d", p.index)),
		HostSide: at(p.HostNet, 1), Addr: at(p.HostNet, 2), Addr2: at(p.HostNet, 3), Private: at(p.PrivateNet, 2)}
	h.DNS = netip.AddrPortFrom(h.Addr, 53).String()
	names := map[string]netip.Addr{"good.test": h.Addr, "bad.test": h.Addr2, "private.test": h.Private}
	iface := fmt.Sprintf("cth%d", p.index)
	cleanup := func() {
		if l, err := netlink.LinkByName(iface); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = unix.Unmount(h.NS, unix.MNT_DETACH)
		_ = os.Remove(h.NS)
	}
	cleanup() // a leftover of a killed test run
	t.Cleanup(cleanup)
	if err := network.NewNetNS(h.NS); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(h.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	la := netlink.NewLinkAttrs()
	la.Name = iface
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(fd)}))
	hostLink, err := netlink.LinkByName(iface)
	must(err)
	for _, a := range []netip.Addr{h.HostSide, at(p.PrivateNet, 1)} {
		must(netlink.AddrAdd(hostLink, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(29, 32)}}))
	}
	must(netlink.LinkSetUp(hostLink))
	// Inside: two addresses, no default route: the test host can only
	// answer the host's veth.
	must(InNetNS(h.NS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{h.Addr, h.Addr2, h.Private} {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(29, 32)}}); err != nil {
				return err
			}
		}
		if lo, err := netlink.LinkByName("lo"); err == nil {
			_ = netlink.LinkSetUp(lo)
		}
		return netlink.LinkSetUp(l)
	}))
	var ln net.Listener
	var pcs []net.PacketConn
	must(InNetNS(h.NS, func() error {
		var err error
		if ln, err = net.Listen("tcp4", ":80"); err != nil {
			return err
		}
		for _, a := range []netip.Addr{h.Addr, h.Addr2} {
			pc, err := listenUDP(netip.AddrPortFrom(a, 53))
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
		}
		return nil
	}))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		host, _, _ := net.SplitHostPort(local.String())
		fmt.Fprintf(w, "hello from %s", host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		name := strings.ToLower(strings.TrimSuffix(q.Question[0].Name, "."))
		a, ok := names[name]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: a.AsSlice()})
		}
		_ = w.WriteMsg(m)
	})
	for _, pc := range pcs {
		s := &dns.Server{PacketConn: pc, Handler: handler}
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	// The host reaches the test host over the veth, or the test is void.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range []netip.Addr{h.Addr, h.Private} {
		if err := waitHTTP(ctx, netip.AddrPortFrom(a, 80).String()); err != nil {
			t.Fatalf("test host does not answer from the host at %s: %v", a, err)
		}
	}
	return h
}

func listenUDP(ap netip.AddrPort) (net.PacketConn, error) {
	return net.ListenPacket("udp4", ap.String())
}

func waitHTTP(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp4", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond): // the listener is up; the veth may still be coming up
		}
	}
}

// InNetNS runs f on a thread in the network namespace at path; sockets f
// makes stay in that namespace.
func InNetNS(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
