package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/sdk"
)

// NetCluster is a cluster of clade daemons, each in a network namespace
// of the test's own with its own address on a bridge in the host's
// namespace (real TCP between them, links the test can cut), each with
// its own data dir, socket and network share, and an etcd member embedded
// in each: a 3-member etcd formed with --cluster-peers.
//
// The addresses are 10.250.I.0/24 (I the test's network share): the
// bridge is .1, node k is .(10+k). No route leaves the namespaces: the
// nodes reach each other and the host's bridge only.
type NetCluster struct {
	t     testing.TB
	Nodes []*NetNode
	// Token is the cluster token (every node's --token-file).
	Token  string
	bridge string
}

// NetNode is one daemon of a NetCluster.
type NetNode struct {
	*Daemon
	Name string
	// NS is its network namespace; Addr its address there; API its
	// --listen (Addr:7070); Etcd its embedded member's client address.
	NS        string
	Addr      netip.Addr
	API, Etcd string
	hostLink  string
	killed    bool
	// Env is added to the daemon's environment at its next (re)start
	// (e.g. CLADE_CRASH_AT).
	Env []string
}

// ClusterPort numbers of each node, on its own address.
const (
	clusterAPIPort  = 7070
	clusterEtcdPort = 2379
	clusterPeerPort = 2380
)

// StartNetCluster starts n daemons (n >= 1) in namespaces, forming one
// cluster over an etcd member in each; extra are flags for every daemon,
// perNode(i) (may be nil) more flags for node i. Everything it makes
// (namespaces, veths, the bridge, the daemons and their sandboxes) is
// removed at the end of the test, on failure too.
func StartNetCluster(t testing.TB, n int, extra []string, perNode func(i int) []string) *NetCluster {
	t.Helper()
	return StartNetClusterWith(t, n, extra, perNode, nil)
}

// StartNetClusterWith is StartNetCluster with setup (may be nil) called
// once the network is made and before the daemons start, with the
// bridge's address in the host's namespace (which every node reaches): a
// server the test starts there (an object store) is the nodes' to use;
// setup returns more flags for every node.
func StartNetClusterWith(t testing.TB, n int, extra []string, perNode func(i int) []string, setup func(bridge netip.Addr) []string) *NetCluster {
	t.Helper()
	RequireRoot(t)
	plan := ReserveNet(t)
	c := &NetCluster{t: t, bridge: fmt.Sprintf("cb%d", plan.index)}
	dir := TempDir(t)
	c.Token = filepath.Join(dir, "token")
	if err := os.WriteFile(c.Token, []byte("cluster-token-"+plan.Prefix+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var peers []string
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		a := netip.AddrFrom4([4]byte{10, 250, byte(plan.index), byte(10 + i + 1)})
		nd := &NetNode{Name: name, Addr: a, NS: filepath.Join(network.NetNSDir, fmt.Sprintf("cb%dn%d", plan.index, i+1)),
			API: netip.AddrPortFrom(a, clusterAPIPort).String(), Etcd: netip.AddrPortFrom(a, clusterEtcdPort).String(),
			hostLink: fmt.Sprintf("cb%dn%d", plan.index, i+1)}
		c.Nodes = append(c.Nodes, nd)
		peers = append(peers, fmt.Sprintf("%s=http://%s", name, netip.AddrPortFrom(a, clusterPeerPort)))
	}
	c.removeNet() // a leftover of a killed test run
	t.Cleanup(c.removeNet)
	if err := c.makeNet(plan.index); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		extra = append(append([]string(nil), extra...), setup(netip.AddrFrom4([4]byte{10, 250, byte(plan.index), 1}))...)
	}
	for i, nd := range c.Nodes {
		// A lease of 4s, above the default 3s: a test kills nodes and waits
		// for their leases to lapse, but a node of a test that kills none
		// must not drop out because a loaded host (the tests' own runsc
		// sandboxes, CI's other packages) held its refresh back for 2s.
		// A test may give another (a later flag wins).
		args := append([]string{"--cluster", "embed", "--node", nd.Name, "--listen", nd.API, "--token-file", c.Token,
			"--cluster-listen", nd.Etcd, "--cluster-peer-listen", netip.AddrPortFrom(nd.Addr, clusterPeerPort).String(),
			"--cluster-lease-ttl", "4s"}, extra...)
		if n > 1 {
			args = append(args, "--cluster-peers", strings.Join(peers, ","))
		}
		if perNode != nil {
			args = append(args, perNode(i)...)
		}
		nd.Daemon = NewDaemon(t, args...)
		nd.Wrap, nd.NetNS = []string{"nsenter", "--net=" + nd.NS}, nd.NS
	}
	// After the daemons' own cleanups are registered, so it runs first.
	t.Cleanup(c.cleanup)
	// The members answer only together (an etcd of 3 needs 2 to serve):
	// all start at once.
	if err := c.launch(c.Nodes); err != nil {
		t.Fatal(err)
	}
	return c
}

// launch starts nodes at once and waits until each answers.
func (c *NetCluster) launch(nodes []*NetNode) error { return c.launchEnv(nodes, nil) }

func (c *NetCluster) launchEnv(nodes []*NetNode, env []string) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		if err := nd.Launch(append(append([]string(nil), nd.Env...), env...)); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = nd.WaitReady(2 * time.Minute); errs[i] == nil {
				nd.killed = false
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *NetCluster) makeNet(index int) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: c.bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s: %w", c.bridge, err)
	}
	brl, err := netlink.LinkByName(c.bridge)
	if err != nil {
		return err
	}
	bra := netip.AddrFrom4([4]byte{10, 250, byte(index), 1})
	if err := netlink.AddrAdd(brl, &netlink.Addr{IPNet: &net.IPNet{IP: bra.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(brl); err != nil {
		return err
	}
	for _, nd := range c.Nodes {
		if err := network.NewNetNS(nd.NS); err != nil {
			return fmt.Errorf("netns %s: %w", nd.NS, err)
		}
		fd, err := unix.Open(nd.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		la := netlink.NewLinkAttrs()
		la.Name = nd.hostLink
		la.MasterIndex = brl.Attrs().Index
		err = netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(fd)})
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("veth %s: %w", nd.hostLink, err)
		}
		hl, err := netlink.LinkByName(nd.hostLink)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(hl); err != nil {
			return err
		}
		if err := InNetNS(nd.NS, func() error {
			if lo, err := netlink.LinkByName("lo"); err == nil {
				if err := netlink.LinkSetUp(lo); err != nil {
					return err
				}
			}
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: nd.Addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			return fmt.Errorf("netns %s: %w", nd.NS, err)
		}
	}
	return nil
}

// removeNet removes the veths, the bridge and the namespaces.
func (c *NetCluster) removeNet() {
	for _, nd := range c.Nodes {
		if l, err := netlink.LinkByName(nd.hostLink); err == nil {
			_ = netlink.LinkDel(l)
		}
		// The IPv4 forwarding registry its daemon kept for its namespace
		// (see internal/network's registryDir).
		var st unix.Stat_t
		if unix.Stat(nd.NS, &st) == nil {
			_ = os.RemoveAll(fmt.Sprintf("/run/clade-network/netns-%d", st.Ino))
		}
		_ = unix.Unmount(nd.NS, unix.MNT_DETACH)
		_ = os.Remove(nd.NS)
	}
	if l, err := netlink.LinkByName(c.bridge); err == nil {
		_ = netlink.LinkDel(l)
	}
}

// cleanup heals every link, restarts the nodes a test killed (their
// sandboxes outlive them and must be removed by them), removes every
// node's sandboxes on it and stops the daemons (removeNet then removes the
// network).
func (c *NetCluster) cleanup() {
	for _, nd := range c.Nodes {
		if nd.Daemon != nil {
			c.setLink(nd, true)
		}
	}
	var dead []*NetNode
	for _, nd := range c.Nodes {
		if nd.Daemon != nil && nd.killed {
			dead = append(dead, nd)
		}
	}
	if len(dead) > 0 {
		if err := c.launch(dead); err != nil {
			c.t.Errorf("cleanup: restart killed nodes: %v", err)
		}
	}
	var wg sync.WaitGroup
	for _, nd := range c.Nodes {
		if nd.Daemon == nil || nd.cmd == nil || nd.Exited() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sbs, err := nd.Client.ListSandboxes(ctx)
			if err != nil {
				c.t.Errorf("cleanup: list on %s: %v", nd.Name, err)
			}
			for _, sb := range sbs {
				if sb.Node != nd.Name {
					continue
				}
				if err := nd.Client.DeleteSandbox(ctx, sb.ID); err != nil && !sdk.IsNotFound(err) {
					c.t.Errorf("cleanup: remove %s on %s: %v", sb.ID, nd.Name, err)
				}
			}
		}()
	}
	wg.Wait()
	for _, nd := range c.Nodes {
		if nd.Daemon != nil && nd.cmd != nil && !nd.Exited() {
			wg.Add(1)
			go func() { defer wg.Done(); nd.Stop() }()
		}
	}
	wg.Wait()
}

func (c *NetCluster) setLink(nd *NetNode, up bool) {
	l, err := netlink.LinkByName(nd.hostLink)
	if err != nil {
		c.t.Errorf("link of %s: %v", nd.Name, err)
		return
	}
	if up {
		err = netlink.LinkSetUp(l)
	} else {
		err = netlink.LinkSetDown(l)
	}
	if err != nil {
		c.t.Errorf("set the link of %s up=%v: %v", nd.Name, up, err)
	}
}

// Partition cuts node i's link: it reaches no other node (nor their etcd
// members), and none reaches it. Its socket still answers the test.
func (c *NetCluster) Partition(i int) { c.setLink(c.Nodes[i], false) }

// Heal puts node i's link back.
func (c *NetCluster) Heal(i int) { c.setLink(c.Nodes[i], true) }

// Kill SIGKILLs node i's daemon (its etcd member with it); its sandboxes
// stay running, as after a crash.
func (c *NetCluster) Kill(i int) {
	c.Nodes[i].Kill()
	c.Nodes[i].killed = true
}

// Restart starts a killed (or stopped) node i again on its data dir and
// waits until it answers.
func (c *NetCluster) Restart(i int) {
	c.t.Helper()
	if err := c.launch(c.Nodes[i : i+1]); err != nil {
		c.t.Fatal(err)
	}
}

// RestartEnv is Restart with env added to the daemon's environment (e.g.
// CLADE_CRASH_AT, to kill it at a crash point).
func (c *NetCluster) RestartEnv(i int, env []string) {
	c.t.Helper()
	if err := c.launchEnv(c.Nodes[i:i+1], env); err != nil {
		c.t.Fatal(err)
	}
}
