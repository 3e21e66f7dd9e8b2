package cluster_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestNetClusterWakeOn wakes a sandbox asleep on n1 on n2, asked through
// n3 (`clade wake --node`): it runs on n2 with its files and its running
// process, n1 no longer has it; the refusals say why (a running sandbox,
// an unknown node, a draining one), and a wake on its own node is a plain
// wake.
func TestNetClusterWakeOn(t *testing.T) {
	c, _ := storeCluster(t, 3, "clade-wakeon", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, nil)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: n1.Name, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, n1, sb.ID, "echo kept > /root/f; (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &")

	// Running: it does not move.
	if _, err := n3.Client.WakeOn(t.Context(), sb.ID, n2.Name); !sdk.IsConflict(err) || !strings.Contains(err.Error(), "sleep it first") {
		t.Fatalf("wake --node of a running sandbox: %v, want a conflict saying to sleep it first", err)
	}
	if _, err := n1.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the sleep image's copy in the object store", func() (bool, string) {
		got, err := n3.Client.GetSandbox(t.Context(), sb.ID)
		return err == nil && got.SleepImage != "", got.State
	})
	if _, err := n3.Client.WakeOn(t.Context(), sb.ID, "nosuch"); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), n2.Name) {
		t.Fatalf("wake --node nosuch: %v, want not found naming the live nodes", err)
	}
	if _, err := n3.Client.DrainNode(t.Context(), n2.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := n3.Client.WakeOn(t.Context(), sb.ID, n2.Name); !sdk.IsConflict(err) || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("wake --node of a draining node: %v, want a conflict saying it drains", err)
	}
	if _, err := n3.Client.UndrainNode(t.Context(), n2.Name); err != nil {
		t.Fatal(err)
	}
	if got, err := n1.Client.GetSandbox(t.Context(), sb.ID); err != nil || got.State != "sleeping" || got.Node != n1.Name {
		t.Fatalf("after the refused wakes: %+v %v, want it asleep on %s", got, err, n1.Name)
	}

	woke, err := n3.Client.WakeOn(t.Context(), sb.ID, n2.Name)
	if err != nil {
		t.Fatal(err)
	}
	if woke.Node != n2.Name || woke.State != "running" {
		t.Fatalf("wake --node %s: %+v", n2.Name, woke)
	}
	if got := shOn(t, n2, sb.ID, "cat /root/f"); got != "kept" {
		t.Fatalf("the file after the move: %q", got)
	}
	// The counter loop slept with it and counts on, on n2.
	first := shOn(t, n2, sb.ID, "cat /tmp/count")
	waitFor(t, 30*time.Second, "the woken counter to count on", func() (bool, string) {
		now := shOn(t, n2, sb.ID, "cat /tmp/count")
		return now != first, now
	})
	for _, nd := range []*testenv.NetNode{n1, n3} {
		got, err := nd.Client.GetSandbox(t.Context(), sb.ID)
		if err != nil || got.Node != n2.Name || got.State != "running" {
			t.Fatalf("through %s after the move: %+v %v, want running on %s", nd.Name, got, err, n2.Name)
		}
	}
	list, err := n1.Client.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.ID == sb.ID && s.Node != n2.Name {
			t.Fatalf("the cluster's list shows the moved sandbox on %s: %+v", s.Node, s)
		}
	}

	// Its own node: a plain wake.
	if _, err := n2.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	again, err := n1.Client.WakeOn(t.Context(), sb.ID, n2.Name)
	if err != nil || again.Node != n2.Name || again.State != "running" {
		t.Fatalf("wake --node of its own node: %+v %v", again, err)
	}
	if got := shOn(t, n1, sb.ID, "cat /root/f"); got != "kept" {
		t.Fatalf("the file after the second wake: %q", got)
	}
}

// TestNetClusterWakeOnOwnNodeFull: a wake asked for on the node a sandbox
// sleeps on, through another node, when that node has no room for it now,
// is refused and the sandbox stays asleep there: it is not moved to a node
// the caller did not name (a plain wake may move it so; a wake --node may
// not). Hostile node names and bodies are refused with a 4xx.
func TestNetClusterWakeOnOwnNodeFull(t *testing.T) {
	c, _ := storeCluster(t, 3, "clade-wakeonfull", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, func(i int) []string {
		if i == 0 {
			return []string{"--memory-overcommit", "0.02"} // about 480 MiB of 24 GiB: one 256 MiB sandbox runs, not two
		}
		return nil
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: n1.Name, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the sleep image's copy in the object store", func() (bool, string) {
		got, err := n3.Client.GetSandbox(t.Context(), sb.ID)
		return err == nil && got.SleepImage != "", got.State
	})

	// Hostile node names: a 4xx, the sandbox untouched.
	for _, name := range []string{strings.Repeat("n", 64<<10), "n2\x00\r\n../../etc", "../" + n2.Name} {
		_, err := n3.Client.WakeOn(t.Context(), sb.ID, name)
		if !sdk.IsNotFound(err) {
			t.Fatalf("wake --node %.40q: %v, want not found", name, err)
		}
	}

	filler, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: n1.Name, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n3.Client.WakeOn(t.Context(), sb.ID, n1.Name)
	if err == nil {
		got, _ := n3.Client.GetSandbox(t.Context(), sb.ID)
		t.Fatalf("wake --node %s with no room there: woke, now %s on %s; want a refusal and the sandbox asleep on %s", n1.Name, got.State, got.Node, n1.Name)
	}
	if !strings.Contains(err.Error(), "memory") {
		t.Fatalf("wake --node %s with no room there: %v, want the refusal for memory", n1.Name, err)
	}
	if got, err := n3.Client.GetSandbox(t.Context(), sb.ID); err != nil || got.State != "sleeping" || got.Node != n1.Name {
		t.Fatalf("after the refused wake --node: %+v %v, want it asleep on %s", got, err, n1.Name)
	}
	// With room again it wakes there.
	if err := n1.Client.DeleteSandbox(t.Context(), filler.ID); err != nil {
		t.Fatal(err)
	}
	woke, err := n3.Client.WakeOn(t.Context(), sb.ID, n1.Name)
	if err != nil || woke.Node != n1.Name || woke.State != "running" {
		t.Fatalf("wake --node %s with room: %+v %v", n1.Name, woke, err)
	}
}

// TestNetClusterWakeOnRace: two wakes --node at once, of one sleeping
// sandbox, to two different nodes, each asked through its own node: one
// moves it and wakes it where it asked; the other is refused (it does not
// give the record on a second time, nor answer a wake on a node it did not
// ask for); the sandbox runs once, on the winner's node, and no record is
// left moving.
func TestNetClusterWakeOnRace(t *testing.T) {
	c, _ := storeCluster(t, 3, "clade-wakeonrace", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, nil)
	byName := map[string]*testenv.NetNode{}
	for _, nd := range c.Nodes {
		byName[nd.Name] = nd
	}
	holder := c.Nodes[0]
	sb, err := holder.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: holder.Name, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if _, err := holder.Client.Sleep(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the sleep image's copy in the object store", func() (bool, string) {
			got, err := holder.Client.GetSandbox(t.Context(), sb.ID)
			return err == nil && got.SleepImage != "", got.State
		})
		var to []*testenv.NetNode
		for _, nd := range c.Nodes {
			if nd != holder {
				to = append(to, nd)
			}
		}
		type result struct {
			sb  sdk.Sandbox
			err error
		}
		res := make([]result, len(to))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, nd := range to {
			wg.Go(func() {
				<-start
				res[i].sb, res[i].err = nd.Client.WakeOn(t.Context(), sb.ID, nd.Name)
			})
		}
		// From round 1, a plain wake on its node races them: the node
		// must not wake it while another node takes its image (the
		// record names no image while it wakes), nor answer a wake that
		// the cluster then undoes.
		var plain result
		if round > 0 {
			wg.Go(func() {
				<-start
				plain.sb, plain.err = holder.Client.Wake(t.Context(), sb.ID)
			})
		}
		close(start)
		wg.Wait()
		var winner *testenv.NetNode
		if round > 0 && plain.err == nil {
			if !slices.ContainsFunc(res, func(r result) bool { return r.err == nil }) {
				winner = byName[plain.sb.Node]
			}
		} else if round > 0 && !sdk.IsConflict(plain.err) && !sdk.IsUnavailable(plain.err) {
			t.Fatalf("round %d: the plain wake on %s: %v", round, holder.Name, plain.err)
		}
		for i, r := range res {
			switch {
			case r.err == nil && r.sb.Node != to[i].Name:
				t.Fatalf("round %d: wake --node %s answered it running on %s", round, to[i].Name, r.sb.Node)
			case r.err == nil && winner != nil:
				t.Fatalf("round %d: both wakes --node (%s, %s) woke it", round, winner.Name, to[i].Name)
			case r.err == nil:
				winner = to[i]
			case !sdk.IsConflict(r.err) && !sdk.IsUnavailable(r.err):
				t.Fatalf("round %d: the losing wake --node %s: %v, want a conflict or try again", round, to[i].Name, r.err)
			}
		}
		if winner == nil {
			t.Fatalf("round %d: no wake woke it: %v; %v; plain %v", round, res[0].err, res[1].err, plain.err)
		}
		if round > 0 && plain.err == nil && plain.sb.Node != winner.Name {
			t.Fatalf("round %d: the plain wake answered it running on %s, a wake --node on %s", round, plain.sb.Node, winner.Name)
		}
		for _, nd := range c.Nodes {
			got, err := nd.Client.GetSandbox(t.Context(), sb.ID)
			if err != nil || got.State != "running" || got.Node != winner.Name {
				t.Fatalf("round %d: through %s: %+v %v, want running on %s", round, nd.Name, got, err, winner.Name)
			}
		}
		list, err := holder.Client.ListSandboxes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range list {
			if s.ID == sb.ID {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: the cluster lists it %d times: %+v", round, n, list)
		}
		holder = byName[winner.Name]
	}
}
