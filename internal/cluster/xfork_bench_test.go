package cluster_test

import (
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestNetClusterForkCosts measures a fork of 6 children of a running
// sandbox across the three nodes (--spread) against one on its node, p50
// of a few rounds, and counts etcd writes per child (held: 1 for a child
// of the source's node, at most 2 for an imported one: its importing
// record, written before the fetch, then its running one). All nodes
// share this host's cores: the figures are of one machine, not of three.
func TestNetClusterForkCosts(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, nil)
	n1 := c.Nodes[0]
	w := countWrites(t, n1.Etcd)
	parent, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, n1.Client, parent.ID, "echo parent-file > /root/f; "+counterScript)
	const n, rounds = 6, 3
	var keys []string
	imported := map[string]bool{}
	fork := func(spread bool) time.Duration {
		var opts []sdk.ForkOption
		if spread {
			opts = append(opts, sdk.Spread())
		}
		start := time.Now()
		res, err := n1.Client.Fork(t.Context(), parent.ID, n, opts...)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]int{}
		for _, ch := range res.Children {
			if ch.Error != "" {
				t.Fatalf("child: %+v", ch)
			}
			nodes[ch.Node]++
			keys = append(keys, "/clade/sandboxes/"+ch.ID)
			imported["/clade/sandboxes/"+ch.ID] = ch.Node != "n1"
		}
		t.Logf("fork of %d (spread %v): %s, by node %v", n, spread, took, nodes)
		if spread != (len(nodes) == 3) {
			t.Fatalf("fork (spread %v) on nodes %v", spread, nodes)
		}
		for _, ch := range res.Children {
			if got := sh(t, n1.Client, ch.ID, "cat /root/f"); got != "parent-file\n" {
				t.Fatalf("child %s: %q", ch.ID, got)
			}
		}
		w.settle()
		for _, ch := range res.Children {
			if err := n1.Client.DeleteSandbox(t.Context(), ch.ID); err != nil {
				t.Fatal(err)
			}
		}
		return took
	}
	var local, spread []time.Duration
	for range rounds {
		local = append(local, fork(false))
		spread = append(spread, fork(true))
	}
	// The last round's removals are written after its deletes answer:
	// wait (bounded) until the watch saw a write and a removal of every
	// child, so a missing write still counts as missing below.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		all := true
		for _, k := range keys {
			all = all && len(w.of(k)) >= 2
		}
		if all {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the watch's view
	}
	writes := 0
	for _, k := range keys {
		// The child's record: its write, and its removal's.
		got := len(w.of(k)) - 1
		writes += got
		if want := 1 + boolInt(imported[k]); got != want {
			t.Errorf("%d etcd writes for fork child %s (imported %v), want %d", got, k, imported[k], want)
		}
	}
	t.Logf("fork of %d p50 over %d: on one node %s, across 3 nodes %s", n, rounds, p50(local), p50(spread))
	t.Logf("etcd writes: %d for %d fork children: %.2f per child", writes, len(keys), float64(writes)/float64(len(keys)))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
