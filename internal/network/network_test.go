package network_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/miekg/dns"
)

// fixture is a Network on the test's own prefix and range, and a test host.
type fixture struct {
	p    testenv.NetPlan
	host *testenv.TestHost
	n    *network.Network
}

func newFixture(t *testing.T, pool int) *fixture {
	t.Helper()
	return newFixtureWith(t, pool, nil)
}

// newFixtureWith is newFixture with edit applied to the Network's config
// (which starts with the plan's range and prefix, and the test host as
// DNS upstream).
func newFixtureWith(t *testing.T, pool int, edit func(*network.Config, testenv.NetPlan)) *fixture {
	t.Helper()
	p := testenv.ReserveNet(t)
	f := &fixture{p: p}
	f.host = testenv.StartTestHost(t, p)
	cfg := network.Config{StateDir: t.TempDir(), Range: p.Range, Prefix: p.Prefix, PoolSize: pool,
		Upstreams: []string{f.host.DNS}}
	if edit != nil {
		edit(&cfg, p)
	}
	n, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.n = n
	t.Cleanup(func() {
		if err := n.Reclaim(context.Background(), nil); err != nil {
			t.Error(err)
		}
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if leaks := p.NetLeaks(); len(leaks) > 0 {
			t.Errorf("leaked: %v", leaks)
		}
	})
	return f
}

// get fetches url (an address, not a name) from inside the slot's
// namespace: the connection is made on a thread in it, then handed to the
// HTTP client.
func get(t *testing.T, s network.Slot, url string) (string, error) {
	t.Helper()
	hostport := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	if !strings.Contains(hostport, ":") {
		hostport += ":80"
	}
	var conn net.Conn
	if err := testenv.InNetNS(s.NetNS, func() error {
		var err error
		conn, err = net.DialTimeout("tcp4", hostport, 5*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	used := false
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, errors.New("one connection only")
			}
			used = true
			return conn, nil
		}}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// lookup asks the slot's resolver for name's A records.
func lookup(t *testing.T, s network.Slot, name string) ([]string, int, error) {
	t.Helper()
	var addrs []string
	rcode := -1
	err := testenv.InNetNS(s.NetNS, func() error {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Timeout: 5 * time.Second}
		resp, _, err := c.Exchange(q, netip.AddrPortFrom(s.Resolver, 53).String())
		if err != nil {
			return err
		}
		rcode = resp.Rcode
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				addrs = append(addrs, a.A.String())
			}
		}
		return nil
	})
	return addrs, rcode, err
}

func refused(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH))
}

func TestEgressPolicy(t *testing.T) {
	f := newFixture(t, 2)
	ctx := t.Context()
	hostURL := "http://" + f.host.Addr.String() + "/"
	hostURL2 := "http://" + f.host.Addr2.String() + "/"
	hostNet := f.p.HostNet.String()

	open, err := f.n.Acquire(ctx, "open", network.Policy{Allow: []string{hostNet}})
	if err != nil {
		t.Fatal(err)
	}
	if body, err := get(t, open, hostURL); err != nil || body != "hello from "+f.host.Addr.String() {
		t.Fatalf("allowed by CIDR: %q, %v", body, err)
	}

	// The default policy (egress allow) reaches what is not private, and
	// keeps private ranges closed.
	def, err := f.n.Acquire(ctx, "default", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if def.Addr == open.Addr || def.NetNS == open.NetNS {
		t.Fatalf("two owners share a slot: %+v %+v", def, open)
	}
	if body, err := get(t, def, hostURL); err != nil || body != "hello from "+f.host.Addr.String() {
		t.Fatalf("egress allow: %q, %v", body, err)
	}
	if _, err := get(t, def, "http://"+f.host.Private.String()+"/"); !refused(err) {
		t.Fatalf("private test host reachable without an allow rule: %v\n%s", err, ruleset(f.p.Prefix))
	}

	// Always closed: the host (gateway and its other addresses, incl. the
	// resolver's port on other protocols), link-local, the sibling.
	// A listener on every host address stands for the daemon's TCP API.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go http.Serve(hostLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	port := strconv.Itoa(hostLn.Addr().(*net.TCPAddr).Port)
	sibling, err := listenIn(def, 8081)
	if err != nil {
		t.Fatal(err)
	}
	defer sibling.Close()
	go http.Serve(sibling, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, url := range []string{
		"http://" + open.Gateway.String() + ":" + port + "/", "http://" + f.host.HostSide.String() + ":" + port + "/",
		"http://" + def.Gateway.String() + ":" + port + "/", "http://169.254.169.254/", "http://" + def.Addr.String() + ":8081/",
	} {
		if _, err := get(t, open, url); !refused(err) {
			t.Errorf("%s reachable: %v", url, err)
		}
	}

	// Hostname allowlist: good.test resolves and is reachable; the other
	// address of the same host, only named by bad.test, is not, and
	// bad.test does not resolve.
	byName, err := f.n.Acquire(ctx, "byname", network.Policy{Allow: []string{"good.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, byName, hostURL); !refused(err) {
		t.Fatalf("address reachable before its name was resolved: %v", err)
	}
	addrs, _, err := lookup(t, byName, "good.test")
	if err != nil || !slices.Equal(addrs, []string{f.host.Addr.String()}) {
		t.Fatalf("lookup good.test: %v %v", addrs, err)
	}
	if body, err := get(t, byName, hostURL); err != nil || !strings.HasPrefix(body, "hello") {
		t.Fatalf("resolved address of an allowed name: %q %v", body, err)
	}
	if _, err := get(t, byName, hostURL2); !refused(err) {
		t.Fatalf("direct IP of a name not allowed is reachable: %v", err)
	}
	if _, rcode, err := lookup(t, byName, "bad.test"); err != nil || rcode != dns.RcodeRefused {
		t.Fatalf("lookup bad.test: rcode %d %v", rcode, err)
	}

	// A policy change on a held slot: deny closes what was open.
	if err := f.n.SetPolicy(ctx, "open", network.Policy{Egress: network.EgressDeny}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, open, hostURL); !refused(err) {
		t.Fatalf("egress deny: %v", err)
	}
	if _, rcode, err := lookup(t, open, "good.test"); err != nil || rcode != dns.RcodeRefused {
		t.Fatalf("egress deny resolves: rcode %d %v", rcode, err)
	}
	// And deny CIDRs win over allow CIDRs.
	if err := f.n.SetPolicy(ctx, "open", network.Policy{Allow: []string{hostNet}, Deny: []string{f.host.Addr.String()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, open, hostURL); !refused(err) {
		t.Fatalf("deny rule: %v", err)
	}
	if _, err := get(t, open, hostURL2); err != nil {
		t.Fatalf("allowed, not denied: %v", err)
	}

	// The host reaches a port inside a slot (what ingress needs).
	ln, err := listenIn(open, 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("inside"))
			c.Close()
		}
	}()
	c, err := f.n.Dial(ctx, "open", 8080)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "inside" {
		t.Fatalf("dial into the slot: %q", b)
	}

	// Release removes the slot; a released owner's slot is not reused by
	// the next owner while... it is gone: a new owner gets a fresh one.
	if err := f.n.Release(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(def.NetNS); !os.IsNotExist(err) {
		t.Fatalf("released netns still there: %v", err)
	}
	if err := f.n.Release(ctx, "default"); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

// ruleset returns the nftables table for failure messages, when the nft
// tool is installed.
func ruleset(prefix string) string {
	out, _ := exec.Command("nft", "list", "table", "inet", prefix).CombinedOutput()
	return string(out)
}

func listenIn(s network.Slot, port int) (net.Listener, error) {
	var ln net.Listener
	err := testenv.InNetNS(s.NetNS, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(s.Addr, uint16(port)).String())
		return err
	})
	return ln, err
}

// A new Network on the same state dir (a daemon restarted after SIGKILL)
// keeps the slots of kept owners and frees everything else.
func TestReclaimAfterRestart(t *testing.T) {
	p := testenv.ReserveNet(t)
	host := testenv.StartTestHost(t, p)
	state := t.TempDir()
	cfg := network.Config{StateDir: state, Range: p.Range, Prefix: p.Prefix, PoolSize: 3, Upstreams: []string{host.DNS}}
	n1, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := n1.Acquire(t.Context(), "keep", network.Policy{Allow: []string{p.HostNet.String()}})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := n1.Acquire(t.Context(), "gone", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	// As if killed: the pool's slots are still built.
	n1.Abandon()
	n2, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n2.Reclaim(context.Background(), nil)
		_ = n2.Close()
		if leaks := p.NetLeaks(); len(leaks) > 0 {
			t.Errorf("leaked: %v", leaks)
		}
	})
	if err := n2.Reclaim(t.Context(), map[string]network.Policy{"keep": {Allow: []string{p.HostNet.String()}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gone.NetNS); !os.IsNotExist(err) {
		t.Fatalf("the slot of a gone owner survived: %v", err)
	}
	s, ok := n2.Lookup("keep")
	if !ok || s != keep {
		t.Fatalf("kept slot: %+v %v, want %+v", s, ok, keep)
	}
	if body, err := get(t, s, "http://"+host.Addr.String()+"/"); err != nil || !strings.HasPrefix(body, "hello") {
		t.Fatalf("kept slot lost its egress: %q %v", body, err)
	}
}

func BenchmarkAcquire(b *testing.B) {
	p := testenv.ReserveNet(b)
	n, err := network.New(b.Context(), network.Config{StateDir: b.TempDir(), Range: p.Range, Prefix: p.Prefix, PoolSize: 4, NoUpstream: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Reclaim(context.Background(), nil); _ = n.Close() })
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		// Wait, untimed, for the pool to be full: Acquire is measured
		// against a warm pool, as in a daemon between creates.
		b.StopTimer()
		for {
			if _, free := n.Stats(); free >= 4 {
				break
			}
			time.Sleep(time.Millisecond) // polling the pool filler
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := n.Acquire(b.Context(), "o", network.Policy{Allow: []string{"example.com"}}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		if err := n.Release(b.Context(), "o"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
}

// TestSlotsSurviveIPNetnsAdd: an operator's `ip netns add` beside a daemon
// bind-mounts /run/netns over itself (when it is not a mount point yet);
// slots made before must still be released and nothing leak.
func TestSlotsSurviveIPNetnsAdd(t *testing.T) {
	f := newFixture(t, 1)
	s, err := f.n.Acquire(t.Context(), "op", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	name := f.p.Prefix + "-ipnetns"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if _, err := os.Stat(s.NetNS); err != nil {
		t.Fatalf("the slot's namespace is hidden after ip netns add: %v", err)
	}
	if err := f.n.Release(t.Context(), "op"); err != nil {
		t.Fatalf("release after ip netns add: %v", err)
	}
}

// Two daemons on one prefix would remove each other's slots as a killed
// daemon's leftovers, and two on overlapping ranges would hand out the
// same addresses: the second one is refused, saying which daemon holds
// them, until the first one closes.
func TestPrefixAndRangeAreClaimed(t *testing.T) {
	p := testenv.ReserveNet(t)
	cfg := network.Config{StateDir: t.TempDir(), Range: p.Range, Prefix: p.Prefix, PoolSize: 1, NoUpstream: true}
	n1, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = n1.Close()
		}
	})
	s, err := n1.Acquire(t.Context(), "live", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name string
		cfg  network.Config
		want string
	}{
		{"same prefix", network.Config{StateDir: t.TempDir(), Range: netip.MustParsePrefix("10.199.250.0/24"), Prefix: p.Prefix, NoUpstream: true},
			"network prefix \"" + p.Prefix + "\" is in use by another clade daemon on this host (pid " + pid + ")"},
		{"overlapping range", network.Config{StateDir: t.TempDir(), Range: p.Range, Prefix: p.Prefix + "x", NoUpstream: true},
			"overlaps " + p.Range.String() + " of the clade daemon with network prefix \"" + p.Prefix + "\" (pid " + pid + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n2, err := network.New(t.Context(), tc.cfg)
			if err == nil {
				_ = n2.Close()
				t.Fatal("a second daemon's network started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if _, err := os.Stat(s.NetNS); err != nil {
		t.Fatalf("the refused daemon touched the live slot: %v", err)
	}
	if err := n1.Reclaim(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	n3, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("the prefix stayed claimed after Close: %v", err)
	}
	if err := n3.Close(); err != nil {
		t.Fatal(err)
	}
	if leaks := p.NetLeaks(); len(leaks) > 0 {
		t.Errorf("leaked: %v", leaks)
	}
}
