package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
)

func node(name string, avail, floor, limit, admitted int64) api.Node {
	return api.Node{Name: name, Capacity: api.NodeCapacity{MemAvailableMiB: avail, MemoryFloorMiB: floor, MemoryLimitMiB: limit,
		MemoryAdmittedMiB: admitted, DefaultMemoryMiB: 512, Engines: []string{"gvisor"}, Images: []string{"default"}}}
}

func names(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.node.Name)
	}
	return out
}

func TestRank(t *testing.T) {
	none := func(api.Node) int64 { return 0 }
	first := func(int) int { return 0 }
	nodes := []api.Node{node("a", 8000, 1000, 0, 0), node("b", 16000, 1000, 4000, 3000), node("c", 9000, 1000, 0, 0)}
	// b has the most MemAvailable, but its overcommit cap leaves 1000 - 512.
	if got := names(rank(nodes, api.CreateSandboxRequest{}, none, first)); len(got) != 3 || got[0] != "c" || got[1] != "a" || got[2] != "b" {
		t.Fatalf("ranked %v, want [c a b]", got)
	}
	// A floor above MemAvailable: the node would refuse, so it is last.
	nodes[2] = node("c", 9000, 9000, 0, 0)
	cs := rank(nodes, api.CreateSandboxRequest{MemoryMiB: 256}, none, first)
	if got := names(cs); got[0] != "a" || got[2] != "c" || cs[2].free >= 0 {
		t.Fatalf("ranked %v (%+v), want a first and c last with negative room", got, cs)
	}
	// Draining, a missing engine, a missing image (held elsewhere): never.
	nodes[0].Draining = true
	nodes[1].Capacity.Engines = []string{"qemu"}
	if got := names(rank(nodes, api.CreateSandboxRequest{Engine: "gvisor"}, none, first)); len(got) != 1 || got[0] != "c" {
		t.Fatalf("ranked %v, want [c]", got)
	}
	if got := names(rank(nodes, api.CreateSandboxRequest{Engine: "qemu"}, none, first)); len(got) != 1 || got[0] != "b" {
		t.Fatalf("qemu ranked %v, want [b]", got)
	}
	nodes[0].Draining = false
	nodes[0].Capacity.Images = append(nodes[0].Capacity.Images, "e2b-base")
	if got := names(rank(nodes, api.CreateSandboxRequest{Image: "e2b-base"}, none, first)); len(got) != 1 || got[0] != "a" {
		t.Fatalf("e2b-base ranked %v, want [a]", got)
	}
	// An image no node has yet: any node may pull it.
	if got := names(rank(nodes, api.CreateSandboxRequest{Image: "python:3"}, none, first)); len(got) != 3 {
		t.Fatalf("an image nowhere ranked %v, want all three", got)
	}
}

// TestPending: creates sent since a node's last refresh count against it
// until a refresh after them; a failed one never counts.
func TestPending(t *testing.T) {
	var p pending
	t0 := time.Now()
	done1 := p.add("a", 512)
	done2 := p.add("a", 256)
	if got := p.since("a", t0); got != 768 {
		t.Fatalf("in flight: %d, want 768", got)
	}
	done2(false)
	done1(true)
	if got := p.since("a", t0); got != 512 {
		t.Fatalf("after one failed: %d, want 512", got)
	}
	if got := p.since("a", time.Now().Add(time.Millisecond)); got != 0 {
		t.Fatalf("after a refresh: %d, want 0", got)
	}
	// Spread: three nodes alike, six creates through one placer.
	nodes := []api.Node{node("a", 1e5, 0, 2048, 0), node("b", 1e5, 0, 2048, 0), node("c", 1e5, 0, 2048, 0)}
	count := map[string]int{}
	for range 6 {
		cs := rank(nodes, api.CreateSandboxRequest{}, func(n api.Node) int64 { return p.since(n.Name, t0) }, defaultRand)
		count[cs[0].node.Name]++
		p.add(cs[0].node.Name, 512)
	}
	if count["a"] != 2 || count["b"] != 2 || count["c"] != 2 {
		t.Fatalf("placed %v, want 2 each", count)
	}
}

// TestDrainReserve: the drain's moves run together, and each that wakes
// its sandbox on the node it is given to takes that node's room until its
// wake is done: of three moves at once onto two nodes with room for one
// each, one lands on each and the third is refused for room (saying each
// node's shortfall); a move whose wake failed gives its room back; a
// sleeping one given lazily (no wake) needs no room.
func TestDrainReserve(t *testing.T) {
	mv := &moves{c: &Cluster{cfg: Config{Node: "a"}}, pending: &pending{}}
	nodes := []api.Node{node("a", 1<<20, 0, 0, 0), node("b", 1<<20, 0, 1000, 0), node("c", 1<<20, 0, 1000, 0)}
	rec := Record{ID: "s", Node: "a", Sandbox: api.Sandbox{Image: "default", MemoryMiB: 512}}
	type got struct {
		node string
		done func(bool)
		err  error
	}
	res := make(chan got, 3)
	start := make(chan struct{})
	for range 3 {
		go func() {
			<-start
			n, done, err := mv.reserve(nodes, rec, true)
			res <- got{n.Name, done, err}
		}()
	}
	close(start)
	on := map[string]func(bool){}
	var refused []error
	for range 3 {
		g := <-res
		switch {
		case g.err != nil:
			refused = append(refused, g.err)
		case on[g.node] != nil:
			t.Fatalf("two moves on node %s, which has room for one", g.node)
		default:
			on[g.node] = g.done
		}
	}
	if len(on) != 2 || len(refused) != 1 || !strings.Contains(refused[0].Error(), "no other node has memory for it now") ||
		!strings.Contains(refused[0].Error(), "node b would be 24 MiB short") {
		t.Fatalf("placed on %d nodes, refused %v: want one on each of b and c and the third refused for room", len(on), refused)
	}
	if why := mv.noRoom(nodes, rec); why == "" {
		t.Fatal("noRoom says a node has room while both are taken")
	}
	on["b"](false) // b's wake failed: its room is free again
	if n, _, err := mv.reserve(nodes, rec, true); err != nil || n.Name != "b" {
		t.Fatalf("after b's move failed: %s %v, want b", n.Name, err)
	}
	if n, done, err := mv.reserve(nodes, rec, false); err != nil || n.Name == "a" || done == nil {
		t.Fatalf("a lazy give without room: %q %v, want b or c", n.Name, err)
	}
	// A wake done counts until the node's capacity, read after it, shows
	// the sandbox.
	on["c"](true)
	later := nodes[2]
	later.RefreshedAt = time.Now().Add(time.Second)
	later.Capacity.MemoryAdmittedMiB = 512
	if n, _, err := mv.reserve([]api.Node{nodes[0], later}, rec, true); err == nil {
		t.Fatalf("c, its capacity showing the moved sandbox, took another: %s", n.Name)
	}
}
