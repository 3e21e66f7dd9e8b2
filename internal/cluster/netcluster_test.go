package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// memTotalMiB reads the host's MemTotal.
func memTotalMiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// waitFor polls cond (a cluster's state as its nodes see it: leases
// lapsing, records changing) until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, timeout, state)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(200 * time.Millisecond): // polling the cluster's state
		}
	}
}

func nodeNames(t *testing.T, c *sdk.Client) (bool, string) {
	ns, err := c.ListNodes(t.Context())
	if err != nil {
		return false, err.Error()
	}
	var names []string
	for _, n := range ns {
		names = append(names, n.Name)
	}
	return true, strings.Join(names, ",")
}

// TestNetCluster runs three daemons, each in a network namespace of its
// own with its own address, forming one 3-member etcd with
// --cluster-peers. Placement spreads creates through one node by memory
// and never picks the node whose --memory-floor leaves it no room; a
// create no node can admit is the retryable 503; exec and ls work through
// a node that does not hold the sandbox; with one etcd member (and its
// node) SIGKILLed, the other two go on creating and proxying.
func TestNetCluster(t *testing.T) {
	floor := memTotalMiB(t) // no MemAvailable is above it: n3 admits nothing
	c := testenv.StartNetCluster(t, 3, []string{"--memory-overcommit", "0.1", "--pressure-floor", "-1"}, func(i int) []string {
		if i == 2 {
			return []string{"--memory-floor", strconv.Itoa(floor)}
		}
		return nil
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	t.Logf("three nodes up")
	for _, nd := range c.Nodes {
		if ok, got := nodeNames(t, nd.Client); !ok || got != "n1,n2,n3" {
			t.Fatalf("node ls on %s: %s, want n1,n2,n3", nd.Name, got)
		}
	}
	ns, err := n1.Client.ListNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Addr != c.Nodes[slices.IndexFunc(c.Nodes, func(x *testenv.NetNode) bool { return x.Name == n.Name })].API {
			t.Errorf("node %s advertises %s", n.Name, n.Addr)
		}
		if n.Capacity.MemoryLimitMiB == 0 || n.Capacity.DefaultMemoryMiB != 512 {
			t.Errorf("node %s capacity %+v: no overcommit cap or default memory", n.Name, n.Capacity)
		}
	}
	if ns[2].Capacity.MemoryFloorMiB != int64(floor) {
		t.Fatalf("n3's floor %d, want %d", ns[2].Capacity.MemoryFloorMiB, floor)
	}

	// Placement: four creates through n1 spread over n1 and n2 by memory
	// (each admits 0.1 x RAM of limits); n3's floor keeps it out.
	placed := map[string][]string{}
	for i := range 4 {
		sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: fmt.Sprintf("p%d", i)})
		if err != nil {
			t.Fatalf("create %d through n1: %v", i, err)
		}
		placed[sb.Node] = append(placed[sb.Node], sb.ID)
	}
	t.Logf("placed: %v", placed)
	// Two and two is the usual answer; a create that answers after its
	// node's capacity read already counted it is counted twice until the
	// next refresh (a second at most: docs/cluster.md), and on a loaded
	// host that can tip the last one to three and one. Both nodes must
	// take some, and n3 none.
	if len(placed["n1"]) == 0 || len(placed["n2"]) == 0 || len(placed["n3"]) != 0 {
		t.Fatalf("placed %v: want n1 and n2 to take two each (at least one each), none on n3 (its floor)", placed)
	}
	// Each is where the create said, as any node sees it.
	for node, ids := range placed {
		for _, id := range ids {
			sb, err := n3.Client.GetSandbox(t.Context(), id)
			if err != nil || sb.Node != node || sb.State != "running" {
				t.Fatalf("%s through n3: %+v %v, want running on %s", id, sb, err, node)
			}
		}
	}
	// A create no node admits: the retryable 503 of one node.
	if _, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{MemoryMiB: 8 * floor / 10}); !sdk.IsUnavailable(err) {
		t.Fatalf("a create above every node's room: %v, want unavailable", err)
	} else {
		t.Logf("full: %v", err)
	}
	// A create that names a node goes there, floor or not... and n3's
	// own admission refuses it.
	if _, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n3"}); !sdk.IsUnavailable(err) {
		t.Fatalf("a create on n3 (no room above its floor): %v, want unavailable", err)
	}

	// Drained (through the CLI), n1 takes no new sandboxes: they go to
	// n2; with n2 drained too, no node may take one.
	clade := func(nd *testenv.NetNode, args ...string) string {
		t.Helper()
		out, err := exec.Command(nd.Bin, append([]string{"--host", nd.Socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("clade %v on %s: %v\n%s", args, nd.Name, err, out)
		}
		return string(out)
	}
	// Without --object-store its running sandboxes cannot move: the
	// drain says so and lists them as holding it.
	drained := clade(n3, "node", "drain", "n1")
	t.Logf("%s", drained)
	if !strings.Contains(drained, "this node has no --object-store: its running sandboxes cannot move") || !strings.Contains(drained, "holding the drain") ||
		!strings.Contains(drained, placed["n1"][0]) {
		t.Fatalf("clade node drain n1 (no --object-store, running sandboxes) does not say they cannot move:\n%s", drained)
	}
	if out := clade(n2, "node", "ls"); !regexp.MustCompile(`(?m)^n1\s+draining\s`).MatchString(out) || !regexp.MustCompile(`(?m)^n2 \*\s+ready\s`).MatchString(out) {
		t.Fatalf("node ls on n2 after n1's drain:\n%s", out)
	}
	// Two, or what n2 still admits when placement gave it three of the
	// four above (each node admits its MemoryLimitMiB of 512 MiB limits).
	room := int(ns[1].Capacity.MemoryLimitMiB/512) - len(placed["n2"])
	if room < 1 {
		t.Fatalf("n2 (%d MiB of limits) has no room after %v", ns[1].Capacity.MemoryLimitMiB, placed)
	}
	for i := range min(2, room) {
		sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{})
		if err != nil || sb.Node != "n2" {
			t.Fatalf("create %d through drained n1: on %q, %v; want n2", i, sb.Node, err)
		}
		placed["n2"] = append(placed["n2"], sb.ID)
	}
	if _, err := n1.Client.DrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	if _, err := n3.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{}); !sdk.IsUnavailable(err) {
		t.Fatalf("a create with n1 and n2 drained (n3 without room): %v, want unavailable", err)
	}
	if _, err := n1.Client.DrainNode(t.Context(), "n9"); !sdk.IsNotFound(err) {
		t.Fatalf("drain of a node that is not there: %v, want not_found", err)
	}
	clade(n1, "node", "drain", "n1", "--undo")
	clade(n1, "node", "undrain", "n2")
	if ns, err := n3.Client.ListNodes(t.Context()); err != nil || ns[0].Draining || ns[1].Draining {
		t.Fatalf("after undrain: %+v %v", ns, err)
	}
	if got := strings.Fields(clade(n3, "ls", "-q", "--node", "n2")); len(got) != len(placed["n2"]) || !sameSet(got, placed["n2"]) {
		t.Fatalf("ls --node n2 through n3: %v, want %v", got, placed["n2"])
	}

	// n2's events and n1's metrics say their node.
	evs, err := n2.Client.Events(t.Context(), sdk.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	nev := 0
	for ev, err := range evs {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Node != "n2" {
			t.Fatalf("an event of n2 says node %q: %+v", ev.Node, ev)
		}
		nev++
	}
	if nev == 0 {
		t.Fatal("no events kept on n2")
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n1.Socket)
	}}}
	resp, err := hc.Get("http://clade/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^clade_wakes_total\{node="n1"\} `).Match(metrics) {
		t.Fatalf("n1's metrics without node=\"n1\":\n%.2000s", metrics)
	}

	// exec and ls through n3, which holds none of them.
	held := placed["n1"][0]
	var out bytes.Buffer
	st, err := n3.Client.Exec(t.Context(), held, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo hi"}, Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "hi\n" {
		t.Fatalf("exec through n3: %+v %v %q", st, err, out.String())
	}
	list, err := n3.Client.ListSandboxes(t.Context())
	if err != nil || len(list) != 6 {
		t.Fatalf("ls through n3: %d sandboxes, %v", len(list), err)
	}

	// One etcd member down (n3's, with its daemon): 2 of 3 serve.
	c.Kill(2)
	waitFor(t, 90*time.Second, "n3's lease lapses", func() (bool, string) {
		ok, got := nodeNames(t, n1.Client)
		return ok && got == "n1,n2", got
	})
	sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "after"})
	if err != nil {
		t.Fatalf("create with 2 of 3 etcd members: %v", err)
	}
	out.Reset()
	if st, err := n2.Client.Exec(t.Context(), held, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || st.Code != 0 {
		t.Fatalf("exec through n2 with 2 of 3 etcd members: %+v %v", st, err)
	}
	if err := n1.Client.DeleteSandbox(t.Context(), "after"); err != nil {
		t.Fatalf("remove %s (on %s) through n1: %v", sb.ID, sb.Node, err)
	}
	c.Restart(2)
	waitFor(t, 30*time.Second, "n3 back", func() (bool, string) {
		ok, got := nodeNames(t, n1.Client)
		return ok && got == "n1,n2,n3", got
	})
}

// TestNetClusterPartition cuts one node's link. Cut off, it keeps serving
// exec on the sandbox it holds, and a create through it is the retryable
// 503 that says etcd does not answer. The others mark that sandbox lost
// (with the reason) once the node's lease lapses, and answer calls on it
// so; when the link is back, the node finds its hold fenced and stops and
// removes the sandbox: it runs nowhere, and its lost record stays until
// it is removed.
func TestNetClusterPartition(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, nil, nil)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	a, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "cut", Node: "n3"})
	if err != nil || a.Node != "n3" {
		t.Fatalf("create on n3: %+v %v", a, err)
	}
	b, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(testenv.ProcessesMentioning(a.ID)) == 0 {
		t.Fatalf("no process mentions %s: the check that it stops would be void", a.ID)
	}

	c.Partition(2)
	t.Logf("n3 cut off")
	// Cut off, n3 serves what it holds...
	var out bytes.Buffer
	if st, err := n3.Client.Exec(t.Context(), a.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo still"}, Stdout: &out}); err != nil || st.Code != 0 || out.String() != "still\n" {
		t.Fatalf("exec on n3 while it is cut off: %+v %v %q", st, err, out.String())
	}
	// ...and refuses creates, retryably, saying why.
	start := time.Now()
	_, err = n3.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{})
	if !sdk.IsUnavailable(err) || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("create through n3 while it is cut off: %v, want unavailable naming etcd", err)
	}
	t.Logf("create through n3 cut off (%s): %v", time.Since(start).Round(time.Millisecond), err)

	// The others see it lost once n3's lease lapses (4 s, and an etcd
	// election first if n3's member led: on a loaded host that and the
	// calls to n3 that fail meanwhile, a few seconds each, take long).
	waitFor(t, 90*time.Second, "n3's sandbox lost on n1", func() (bool, string) {
		sb, err := n1.Client.GetSandbox(t.Context(), "cut")
		return err == nil && sb.State == "lost" && strings.Contains(sb.Error, "n3"), fmt.Sprintf("%+v %v", sb.State, err)
	})
	list, err := n2.Client.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if want := map[string]string{a.ID: "lost", b.ID: "running"}[sb.ID]; sb.State != want {
			t.Fatalf("ls on n2: %s is %s, want %s", sb.ID, sb.State, want)
		}
	}
	if _, err := n2.Client.Exec(t.Context(), a.ID, sdk.ExecRequest{Cmd: []string{"true"}}); !sdk.IsConflict(err) || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("exec through n2 on the lost sandbox: %v, want a conflict saying lost", err)
	}
	// The name stays the lost sandbox's.
	if _, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "cut"}); !sdk.IsConflict(err) {
		t.Fatalf("a create of the lost sandbox's name: %v", err)
	}

	// Back: n3 rejoins, finds its hold fenced, and stops the sandbox.
	c.Heal(2)
	t.Logf("n3 back")
	waitFor(t, 60*time.Second, "n3 stops the fenced sandbox", func() (bool, string) {
		left := testenv.ProcessesMentioning(a.ID)
		sb, err := n3.Client.GetSandbox(t.Context(), a.ID)
		return len(left) == 0 && err == nil && sb.State == "lost", fmt.Sprintf("%d processes, %s %v", len(left), sb.State, err)
	})
	waitFor(t, 30*time.Second, "n3 back in node ls", func() (bool, string) {
		ok, got := nodeNames(t, n1.Client)
		return ok && got == "n1,n2,n3", got
	})
	if sb, err := n1.Client.GetSandbox(t.Context(), b.ID); err != nil || sb.State != "running" {
		t.Fatalf("n1's sandbox after the partition: %+v %v", sb, err)
	}
	// Removing the lost sandbox drops its record and frees its name.
	if err := n2.Client.DeleteSandbox(t.Context(), "cut"); err != nil {
		t.Fatalf("remove the lost sandbox: %v", err)
	}
	if _, err := n1.Client.GetSandbox(t.Context(), a.ID); !sdk.IsNotFound(err) {
		t.Fatalf("the lost sandbox after its removal: %v", err)
	}
	sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "cut"})
	if err != nil {
		t.Fatalf("the name after the lost sandbox's removal: %v", err)
	}
	t.Logf("cut again, on %s", sb.Node)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// shOn runs script with sh in sandbox id through node nd and returns its
// output, trimmed; a failure or a non-zero exit fails the test.
func shOn(t *testing.T, nd *testenv.NetNode, id, script string) string {
	t.Helper()
	var out strings.Builder
	st, err := nd.Client.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec %q through %s: %v %+v %s", script, nd.Name, err, st, out.String())
	}
	return strings.TrimSpace(out.String())
}
