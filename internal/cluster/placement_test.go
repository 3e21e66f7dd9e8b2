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

// TestPending: creates sent to a node count against it until its capacity
// counts them; a failed one never counts.
func TestPending(t *testing.T) {
	var p pending
	cap0 := node("a", 1e5, 0, 0, 0)
	done1 := p.add("a", "", 512)
	done2 := p.add("a", "", 256)
	if got := p.of(cap0); got != 768 {
		t.Fatalf("in flight: %d, want 768", got)
	}
	done2(false)
	done1(true, "s1")
	if got := p.of(cap0); got != 512 {
		t.Fatalf("after one failed: %d, want 512", got)
	}
	counted := cap0
	counted.Capacity.Admits, counted.Capacity.MemoryAdmittedMiB = []string{"s1"}, 512
	if got := p.of(counted); got != 0 {
		t.Fatalf("after a capacity that counts it: %d, want 0", got)
	}
	// Spread: three nodes alike, six creates through one placer.
	nodes := []api.Node{node("a", 1e5, 0, 2048, 0), node("b", 1e5, 0, 2048, 0), node("c", 1e5, 0, 2048, 0)}
	count := map[string]int{}
	for range 6 {
		cs := rank(nodes, api.CreateSandboxRequest{}, p.of, defaultRand)
		count[cs[0].node.Name]++
		p.add(cs[0].node.Name, "", 512)
	}
	if count["a"] != 2 || count["b"] != 2 || count["c"] != 2 {
		t.Fatalf("placed %v, want 2 each", count)
	}
}

// TestPendingOnce: a create, a wake or a move sent to a node counts
// against it exactly once, whatever capacity placement reads: one written
// while it is being made (it counts it already, among those starting),
// one read before its answer but written after it, one read after it
// (it went meanwhile). Before, such a node looked short by twice the
// sandbox's memory for up to a second. The clock is the test's; the
// capacities are scripted as a node would write them.
func TestPendingOnce(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := pending{now: func() time.Time { return now }}
	at := func(d time.Duration, admitted, starting int64, admits, startingIDs []string) api.Node {
		n := node("a", 1e5, 0, 4096, admitted)
		n.RefreshedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(d)
		n.Capacity.MemoryStartingMiB, n.Capacity.Admits, n.Capacity.Starting = starting, admits, startingIDs
		return n
	}
	room := func(n api.Node) int64 { return freeAfter(n, 512, p.of(n)) }
	check := func(what string, n api.Node, want int64) {
		t.Helper()
		if got := room(n); got != want {
			t.Fatalf("%s: room after another 512 MiB: %d, want %d (pending %d)", what, got, want, p.of(n))
		}
	}
	// A create of 512 MiB goes out at 0 s.
	done := p.add("a", "", 512)
	check("before the node has it", at(0, 0, 0, nil, nil), 4096-512-512)
	// Written at 0.5 s, the node's capacity counts it, being made.
	now = now.Add(time.Second)
	check("the capacity counts it, being made", at(500*time.Millisecond, 512, 512, []string{"s1"}, []string{"s1"}), 4096-512-512)
	// It answers at 1 s; a capacity read at 0.9 s (written after) counts
	// it running; one read at 1.2 s too.
	done(true, "s1")
	check("read before its answer, written after", at(900*time.Millisecond, 512, 0, []string{"s1"}, nil), 4096-512-512)
	check("read after its answer", at(1200*time.Millisecond, 512, 0, []string{"s1"}, nil), 4096-512-512)
	// Another create answers at 2 s, and the sandbox is removed before
	// the node's next capacity: once read after the answer, nothing.
	done = p.add("a", "", 512)
	now = now.Add(time.Second)
	done(true, "s2")
	check("answered, the capacity read before", at(1500*time.Millisecond, 512, 0, []string{"s1"}, nil), 4096-512-512-512)
	check("answered, removed before the capacity", at(2500*time.Millisecond, 512, 0, []string{"s1"}, nil), 4096-512-512)

	// A wake of s3 (a drain's move): its id is known from the start.
	wdone := p.add("a", "s3", 512)
	check("the wake sent", at(3*time.Second, 512, 0, []string{"s1"}, nil), 4096-512-512-512)
	check("the wake, waking there", at(3500*time.Millisecond, 1024, 512, []string{"s1", "s3"}, []string{"s3"}), 4096-1024-512)
	// While s3 wakes, a create of ours is in flight and is not made
	// there yet: s3's starting memory is s3's, not the create's.
	cdone := p.add("a", "", 512)
	check("s3 waking and a create in flight", at(3600*time.Millisecond, 1024, 512, []string{"s1", "s3"}, []string{"s3"}), 4096-1024-512-512)
	cdone(false)
	now = now.Add(2 * time.Second)
	wdone(true)
	check("the wake done, running there", at(4500*time.Millisecond, 1024, 0, []string{"s1", "s3"}, nil), 4096-1024-512)
	// Nothing is left to count once the capacity names all of it.
	p.mu.Lock()
	left := len(p.m["a"])
	p.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d entries left: %+v", left, p.m["a"])
	}
	// The memory floor's side counts what is being made or woken there,
	// as the node's own admission does.
	n := node("b", 4000, 1000, 0, 0)
	n.Capacity.MemoryStartingMiB, n.Capacity.Starting, n.Capacity.Admits = 1024, []string{"x"}, []string{"x"}
	if got := freeAfter(n, 512, p.of(n)); got != 4000-1000-1024-512 {
		t.Fatalf("the floor's room with 1024 MiB being made there: %d", got)
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
	// A wake done counts until the node's capacity names the sandbox,
	// and then there only: once.
	on["c"](true)
	if n, _, err := mv.reserve([]api.Node{nodes[0], nodes[2]}, rec, true); err == nil {
		t.Fatalf("c, its capacity not showing the moved sandbox yet, took another: %s", n.Name)
	}
	later := nodes[2]
	later.RefreshedAt = time.Now().Add(-time.Second) // read before the wake answered, written after
	later.Capacity.MemoryAdmittedMiB, later.Capacity.Admits = 512, []string{"s"}
	if n, _, err := mv.reserve([]api.Node{nodes[0], later}, rec, true); err == nil {
		t.Fatalf("c, its capacity showing the moved sandbox, took another: %s", n.Name)
	}
	if why := mv.noRoom([]api.Node{nodes[0], later}, rec); !strings.Contains(why, "node c would be 24 MiB short") {
		t.Fatalf("c's shortfall, its capacity counting the moved sandbox: %q, want 24 MiB (counted once)", why)
	}
}
