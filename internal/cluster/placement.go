package cluster

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
)

// placeK is how many candidates placement compares: the best of K nodes,
// sampled from those that may take the create.
const placeK = 3

// pending remembers the memory of creates this node sent to each node
// since that node last wrote its capacity: a burst of creates between two
// refreshes must not all land on the node that looked freest.
type pending struct {
	mu  sync.Mutex
	m   map[string][]placed // by node; guarded by mu
	seq uint64              // guarded by mu
}

type placed struct {
	id  uint64
	at  time.Time // when the create answered; zero while it runs
	mib int64
}

// add counts a create of mib sent to node; done says how it ended: a
// create that failed took nothing, one that succeeded counts until the
// node's capacity, read after it, shows it.
func (p *pending) add(node string, mib int64) (done func(ok bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string][]placed{}
	}
	p.seq++
	id := p.seq
	p.m[node] = append(p.m[node], placed{id: id, mib: mib})
	return func(ok bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !ok {
			p.m[node] = slices.DeleteFunc(p.m[node], func(x placed) bool { return x.id == id })
			return
		}
		for i := range p.m[node] {
			if p.m[node][i].id == id {
				p.m[node][i].at = time.Now()
			}
		}
	}
}

// since is the memory sent to node after t (its capacity's time), and
// forgets what came before.
func (p *pending) since(node string, t time.Time) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[node] == nil {
		return 0
	}
	p.m[node] = slices.DeleteFunc(p.m[node], func(x placed) bool { return !x.at.IsZero() && !x.at.After(t) })
	var n int64
	for _, x := range p.m[node] {
		n += x.mib
	}
	return n
}

// candidate is a node placement may pick, with the memory it would have
// free after admitting the create.
type candidate struct {
	node api.Node
	free int64
}

// freeAfter is the memory node would have left after admitting a sandbox
// of mib (its default when 0), by its own admission's rules: MemAvailable
// above its floor, and room under its overcommit cap. Negative: it would
// refuse.
func freeAfter(n api.Node, mib, pendingMiB int64) int64 {
	c := n.Capacity
	if mib <= 0 {
		mib = cmp.Or(c.DefaultMemoryMiB, 512)
	}
	// MemAvailable falls only as a sandbox touches its memory; count
	// what was sent since the last refresh as taken.
	free := c.MemAvailableMiB - c.MemoryFloorMiB - pendingMiB - mib
	if c.MemoryLimitMiB > 0 {
		free = min(free, c.MemoryLimitMiB-c.MemoryAdmittedMiB-pendingMiB-mib)
	}
	return free
}

// eligible is whether n may take a create of req at all: not draining,
// runs its engine, and (when any node has it) holds its image.
func eligible(n api.Node, req api.CreateSandboxRequest, imageSomewhere bool) bool {
	if n.Draining {
		return false
	}
	if req.Engine != "" && !slices.Contains(n.Capacity.Engines, req.Engine) {
		return false
	}
	if req.Engine == "" && len(n.Capacity.Engines) == 0 {
		return false
	}
	return !imageSomewhere || slices.Contains(n.Capacity.Images, imageName(req))
}

func imageName(req api.CreateSandboxRequest) string { return cmp.Or(req.Image, "default") }

// rank orders the nodes that may take req, best first: of at most placeK
// sampled among the eligible, the most memory free after admission
// (fewest sandboxes on a tie). Nodes that would refuse for memory come
// last, so that a full cluster answers with a node's own refusal.
func rank(nodes []api.Node, req api.CreateSandboxRequest, pendingOf func(api.Node) int64, rnd func(int) int) []candidate {
	imageSomewhere := slices.ContainsFunc(nodes, func(n api.Node) bool { return slices.Contains(n.Capacity.Images, imageName(req)) })
	return rankFor(nodes, req, imageSomewhere, pendingOf, rnd)
}

// rankAnywhere is rank for a sandbox whose image root a node without the
// image fetches (a moved sleeping sandbox): nodes holding the image come
// first (no fetch), the others after them.
func rankAnywhere(nodes []api.Node, req api.CreateSandboxRequest, pendingOf func(api.Node) int64, rnd func(int) int) []candidate {
	with := rankFor(nodes, req, true, pendingOf, rnd)
	for _, c := range rankFor(nodes, req, false, pendingOf, rnd) {
		if !slices.ContainsFunc(with, func(w candidate) bool { return w.node.Name == c.node.Name }) {
			with = append(with, c)
		}
	}
	return with
}

// rankFor is rank, with only the nodes that hold req's image if
// needImage.
func rankFor(nodes []api.Node, req api.CreateSandboxRequest, needImage bool, pendingOf func(api.Node) int64, rnd func(int) int) []candidate {
	imageSomewhere := needImage
	var cs []candidate
	for _, n := range nodes {
		if eligible(n, req, imageSomewhere) {
			cs = append(cs, candidate{node: n, free: freeAfter(n, int64(req.MemoryMiB), pendingOf(n))})
		}
	}
	// Best of K: a random sample, so that many placing nodes do not all
	// pile onto one node whose refresh is late.
	for i := len(cs) - 1; i > 0; i-- {
		j := rnd(i + 1)
		cs[i], cs[j] = cs[j], cs[i]
	}
	if len(cs) > placeK {
		cs = cs[:placeK]
	}
	slices.SortStableFunc(cs, func(a, b candidate) int {
		if c := cmp.Compare(b.free, a.free); c != 0 {
			return c
		}
		return cmp.Compare(a.node.Capacity.Sandboxes, b.node.Capacity.Sandboxes)
	})
	return cs
}

func defaultRand(n int) int { return rand.IntN(n) }
