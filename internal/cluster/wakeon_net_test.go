package cluster_test

import (
	"strings"
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
