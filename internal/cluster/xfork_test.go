package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// counterScript starts a background Python process that counts in memory
// and publishes the count in /tmp/count, and waits until it has started.
const counterScript = `nohup python3 -c '
import os, time
i = 0
while True:
    i += 1
    open("/tmp/count.tmp", "w").write(str(i)); os.rename("/tmp/count.tmp", "/tmp/count")
    time.sleep(0.01)
' > /dev/null 2>&1 &
until [ -s /tmp/count ]; do sleep 0.01; done`

// sh runs a shell command in id through c and returns its stdout.
func sh(t *testing.T, c *sdk.Client, id, cmd string) string {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", cmd}, Stdout: &out, Stderr: &errb})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec %q in %s: %v %+v %s", cmd, id, err, st, errb.String())
	}
	return out.String()
}

func count(t *testing.T, c *sdk.Client, id string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, c, id, "cat /tmp/count")))
	if err != nil {
		t.Fatalf("count in %s: %v", id, err)
	}
	return n
}

// TestNetClusterFork forks a running sandbox of n1 through n3 with the
// spread: twelve children across the three nodes (n2's and n3's fetch the
// snapshot from n1 over HTTP by digest and verify it), each with the
// parent's file, its own writes, the parent's counter counting on, its
// own entropy. A fork through a node without room stays where it may; a
// target SIGKILLed mid-import is named as failed in the owner's answer
// and, restarted, holds nothing half made.
func TestNetClusterFork(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, nil)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	parent, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: 256})
	if err != nil || parent.Node != "n1" {
		t.Fatalf("create on n1: %+v %v", parent, err)
	}
	sh(t, n1.Client, parent.ID, "echo parent-file > /root/f; "+counterScript)
	atFork := count(t, n1.Client, parent.ID)

	start := time.Now()
	res, err := n3.Client.Fork(t.Context(), parent.ID, 12, sdk.Spread())
	if err != nil {
		t.Fatalf("fork 12 spread through n3: %v", err)
	}
	t.Logf("fork of 12 across 3 nodes: %v", time.Since(start))
	on := map[string][]string{}
	for i, ch := range res.Children {
		if ch.Error != "" || ch.ID == "" || ch.Node == "" {
			t.Fatalf("child %d: %+v", i, ch)
		}
		on[ch.Node] = append(on[ch.Node], ch.ID)
	}
	t.Logf("children by node: n1 %d, n2 %d, n3 %d", len(on["n1"]), len(on["n2"]), len(on["n3"]))
	if len(res.Children) != 12 || len(on["n1"]) == 0 || len(on["n2"]) == 0 || len(on["n3"]) == 0 {
		t.Fatalf("fork result %+v: want 12 children on all three nodes", res)
	}
	// Each child through a node that (mostly) does not hold it: the
	// directory has their records by the answer.
	var mu sync.Mutex
	entropy := map[string]string{}
	var wg sync.WaitGroup
	for i, ch := range res.Children {
		via := c.Nodes[(i+1)%3].Client
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := via.GetSandbox(t.Context(), ch.ID)
			if err != nil || sb.Node != ch.Node || sb.State != "running" {
				t.Errorf("child %s: %+v %v, want running on %s", ch.ID, sb, err, ch.Node)
				return
			}
			if got := sh(t, via, ch.ID, fmt.Sprintf("cat /root/f; echo child-%d > /root/own; cat /root/own", i)); got != fmt.Sprintf("parent-file\nchild-%d\n", i) {
				t.Errorf("child %s on %s: %q", ch.ID, ch.Node, got)
			}
			n := count(t, via, ch.ID)
			if n < atFork-100 {
				t.Errorf("child %s: counter %d, the parent's was about %d at the fork", ch.ID, n, atFork)
			}
			deadline := time.Now().Add(time.Minute)
			for count(t, via, ch.ID) <= n {
				if time.Now().After(deadline) {
					t.Errorf("child %s on %s: the counter does not count", ch.ID, ch.Node)
					return
				}
			}
			e := sh(t, via, ch.ID, "head -c 16 /dev/urandom | od -An -tx1")
			mu.Lock()
			defer mu.Unlock()
			if other, ok := entropy[e]; ok {
				t.Errorf("children %s and %s read the same /dev/urandom bytes", other, ch.ID)
			}
			entropy[e] = ch.ID
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// The parent's files are its own.
	if got := sh(t, n1.Client, parent.ID, "cat /root/own 2>/dev/null || echo none"); got != "none\n" {
		t.Fatalf("parent sees a child's write: %q", got)
	}
	for _, ch := range res.Children {
		if err := n2.Client.DeleteSandbox(t.Context(), ch.ID); err != nil {
			t.Fatalf("remove %s through n2: %v", ch.ID, err)
		}
	}

	// A target SIGKILLed after fetching, before recording: the owner
	// names its children failed; restarted, it holds nothing of the fork.
	res = forkThroughCrash(t, c, parent.ID, "xfork-import-fetched")
	c.Kill(2)
	c.Restart(2)
	sbs, err := n3.Client.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.Node == "n3" {
			t.Errorf("n3 after its restart holds %s (%s)", sb.ID, sb.State)
		}
	}
	if sns, err := n3.Client.ListSnapshots(t.Context()); err != nil || len(sns) != 0 {
		t.Errorf("n3 after its restart has snapshots %+v %v", sns, err)
	}
	_ = filepath.WalkDir(n3.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".import-") {
			t.Errorf("n3 after its restart keeps a fetch dir %s", p)
		}
		return nil
	})
	for _, ch := range res.Children {
		if ch.ID != "" {
			if got := sh(t, n3.Client, ch.ID, "cat /root/f"); got != "parent-file\n" {
				t.Errorf("child %s: %q", ch.ID, got)
			}
		}
	}
}

// TestNetClusterForkRefused forks where the nodes cannot hold every
// child (each admits 0.1 x RAM of limits; n3's --memory-floor leaves it no
// room): without the spread the children stay on the parent's node; with
// it they fill n1 and n2 and each child left over is refused with the
// node's own reason.
func TestNetClusterForkRefused(t *testing.T) {
	total := memTotalMiB(t)
	c := testenv.StartNetCluster(t, 3, []string{"--memory-overcommit", "0.1", "--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, func(i int) []string {
		if i == 2 {
			return []string{"--memory-floor", strconv.Itoa(total)}
		}
		return nil
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	parent, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, n1.Client, parent.ID, "echo parent-file > /root/f")
	res, err := n2.Client.Fork(t.Context(), parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range res.Children {
		if ch.Error != "" || ch.Node != "n1" {
			t.Fatalf("a fork without the spread, with room on n1: %+v", res)
		}
	}
	// What each admits: 0.1 x RAM of limits, 512 MiB each (n1 holds the
	// parent and two children).
	limit := int(0.1 * float64(total))
	room := (limit-3*512)/512 + limit/512
	waitFor(t, 30*time.Second, "n1's capacity counts the children", func() (bool, string) {
		ns, err := n3.Client.ListNodes(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return ns[0].Capacity.MemoryAdmittedMiB == 3*512, fmt.Sprint(ns[0].Capacity.MemoryAdmittedMiB)
	})
	n := room + 3
	res, err = n3.Client.Fork(t.Context(), parent.ID, n, sdk.Spread())
	if err != nil {
		t.Fatal(err)
	}
	made, refused := map[string]int{}, 0
	for _, ch := range res.Children {
		switch {
		case ch.Error == "":
			made[ch.Node]++
		case ch.Node == "" || ch.Code != "unavailable" || !strings.Contains(ch.Error, "memory") || !strings.Contains(ch.Error, "node "+ch.Node):
			t.Errorf("a refused child without its node and reason: %+v", ch)
		default:
			refused++
		}
	}
	t.Logf("fork of %d (room for %d): made %v, refused %d; e.g. %q", n, room, made, refused, res.Children[len(res.Children)-1].Error)
	if made["n3"] != 0 || made["n1"]+made["n2"] != room || refused != n-room {
		t.Fatalf("fork of %d with room for %d: made %v, %d refused", n, room, made, refused)
	}
	// The owner without room: a fork without the spread goes to the
	// others... which have none either: each child is refused, saying why.
	res, err = n1.Client.Fork(t.Context(), parent.ID, 1)
	if err != nil || len(res.Children) != 1 || res.Children[0].Error == "" {
		t.Fatalf("a fork with no room anywhere: %+v %v", res, err)
	}
	// The CLI: `clade fork --spread` through n3, with room nowhere, says
	// each child's node and why, and exits 1.
	out, err := exec.Command(n3.Bin, "--host", n3.Socket, "fork", parent.ID, "-n", "2", "--spread", "--json").Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), `"node": "n`) || !strings.Contains(string(out), "memory") {
		t.Fatalf("clade fork --spread with room nowhere: %v\n%s", err, out)
	}

	// A share its node refuses although placement saw room there (n3 back
	// with memory to spare but a --disk-floor no disk meets, which its
	// capacity does not tell) is placed again on the nodes that did not
	// refuse before the fork gives up on those children.
	sbs, err := n1.Client.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.ID != parent.ID {
			if err := n1.Client.DeleteSandbox(t.Context(), sb.ID); err != nil {
				t.Fatalf("remove %s: %v", sb.ID, err)
			}
		}
	}
	n3.Stop()
	n3.SetArgs("--memory-floor", "0", "--disk-floor", "1000000000")
	c.Restart(2)
	waitFor(t, 30*time.Second, "the capacities show n1 with the parent only, and n3 with room", func() (bool, string) {
		ns, err := n2.Client.ListNodes(t.Context())
		if err != nil || len(ns) != 3 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Capacity.MemoryAdmittedMiB == 512 && ns[1].Capacity.MemoryAdmittedMiB == 0 && ns[2].Capacity.MemoryFloorMiB < int64(total/2),
			fmt.Sprint(ns[0].Capacity, ns[2].Capacity)
	})
	res, err = n2.Client.Fork(t.Context(), parent.ID, 3, sdk.Spread())
	if err != nil {
		t.Fatal(err)
	}
	made = map[string]int{}
	for _, ch := range res.Children {
		if ch.Error != "" {
			t.Fatalf("a child of a fork with room on n1 and n2 (n3 refusing on its disk floor): %+v", res)
		}
		made[ch.Node]++
	}
	if made["n3"] != 0 || made["n1"]+made["n2"] != 3 {
		t.Fatalf("fork of 3, n3 refusing: made %v", made)
	}
	if !strings.Contains(n1.Log(), "fork shares refused by their nodes are placed again") {
		t.Fatalf("n3 did not refuse a share that was placed again (the case above proves nothing); made %v", made)
	}
	t.Logf("fork of 3 with n3 refusing its share: made %v", made)
}

// leaseTTL is the fork tests' node lease: restores of many children at
// once take this host's two shared cores, and a 2 s lease lapsed under
// them (a node's refresh waits for its capacity read), marking the
// parent lost.
const leaseTTL = "8s"

// TestNetClusterForkOwnerKilled SIGKILLs the owner of a spread fork as the
// first other node starts fetching the snapshot from it: the fork fails,
// and once the owner is back no node holds anything half made (a fetch
// dir, a snapshot nobody uses, a child in creating).
func TestNetClusterForkOwnerKilled(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, nil)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	parent, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, n1.Client, parent.ID, "echo parent-file > /root/f")
	c.Kill(0)
	n1.Env = []string{"CLADE_CRASH_AT=xfork-export-open"}
	c.Restart(0)
	n1.Env = nil
	res, err := n2.Client.Fork(t.Context(), parent.ID, 6, sdk.Spread())
	if err == nil {
		t.Fatalf("a fork whose owner died answered %+v", res)
	}
	t.Logf("fork through n2, n1 killed mid-fork: %v", err)
	if err := n1.Wait(); err == nil {
		t.Fatal("n1 did not crash")
	}
	c.Kill(0)
	c.Restart(0)
	for _, nd := range c.Nodes {
		waitFor(t, time.Minute, nd.Name+" holds nothing of the fork", func() (bool, string) {
			sbs, err := nd.Client.ListSandboxes(t.Context())
			if err != nil {
				return false, err.Error()
			}
			var held []string
			for _, sb := range sbs {
				if sb.Node == nd.Name && sb.ID != parent.ID {
					held = append(held, sb.ID+" "+sb.State)
				}
			}
			sns, err := nd.Client.ListSnapshots(t.Context())
			if err != nil {
				return false, err.Error()
			}
			return len(held) == 0 && len(sns) == 0, fmt.Sprintf("sandboxes %v, snapshots %d", held, len(sns))
		})
		_ = filepath.WalkDir(nd.DataDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.Contains(d.Name(), ".import-") {
				t.Errorf("%s keeps a fetch dir %s", nd.Name, p)
			}
			return nil
		})
	}
	// The parent is as the cluster left it: running on n1, or lost if
	// n1's lease lapsed before it was back.
	sb, err := n2.Client.GetSandbox(t.Context(), parent.ID)
	t.Logf("the parent after n1's restart: %s (%s) %v", sb.State, sb.Error, err)
	if err != nil || sb.State != "running" && sb.State != "lost" {
		t.Fatalf("the parent after n1's restart: %+v %v", sb, err)
	}
}

// forkThroughCrash restarts c's third node with the crash point at and
// forks 6 children of parent with the spread through the first: the
// children placed on the third fail (at least one is placed there), the
// others are made, and the third node crashed.
func forkThroughCrash(t *testing.T, c *testenv.NetCluster, parent, at string) sdk.ForkResult {
	t.Helper()
	n1, n3 := c.Nodes[0], c.Nodes[2]
	c.Kill(2)
	n3.Env = []string{"CLADE_CRASH_AT=" + at}
	c.Restart(2)
	n3.Env = nil
	res, err := n1.Client.Fork(t.Context(), parent, 6, sdk.Spread())
	if err != nil {
		t.Fatalf("fork with n3 crashing at %s: %v", at, err)
	}
	failed := 0
	for _, ch := range res.Children {
		switch {
		case ch.Node == "n3" && ch.Error == "":
			t.Fatalf("a child on n3, which crashed at %s: %+v", at, ch)
		case ch.Node == "n3":
			failed++
			t.Logf("n3's child: %s (%s)", ch.Error, ch.Code)
		case ch.Error != "":
			t.Fatalf("child on %s failed: %+v", ch.Node, ch)
		}
	}
	if failed == 0 {
		t.Fatalf("no child was placed on n3: %+v", res)
	}
	if err := n3.Wait(); err == nil {
		t.Fatalf("n3 did not crash at %s", at)
	}
	return res
}
