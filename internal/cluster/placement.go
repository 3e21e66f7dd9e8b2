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

// AdmitWindow is how long a node's capacity names a sandbox it admitted
// (api.NodeCapacity.Admits): far longer than a refresh takes to reach a
// placing node, so a placer that reads the node's capacity now and then
// still sees the ids of what it sent.
const AdmitWindow = 30 * time.Second

// pending remembers the memory of the creates, wakes and moves this node
// sent to each node that the node's capacity does not count yet: a burst
// of creates between two refreshes must not all land on the node that
// looked freest, nor one be counted twice (by the capacity that already
// counts it, and here). The capacity names what it counts lately
// (Admits, Starting): what it names is no longer counted here.
type pending struct {
	mu  sync.Mutex
	m   map[string][]placed // by node; guarded by mu
	seq uint64              // guarded by mu
	now func() time.Time    // time.Now when nil (a test's clock)
}

type placed struct {
	seq  uint64
	id   string    // the sandbox: known at once for a wake, at its answer for a create
	done time.Time // when it answered; zero while it runs
	mib  int64
	each int64 // of a share of several (a fork's): each sandbox's memory
	// named: a capacity named it while it was being made or woken (no
	// longer counted here; kept to tell it from others' in Starting).
	named bool
}

func (p *pending) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// add counts an admission of mib sent to node: a wake or a move of
// sandbox id, or a create (id "") whose sandboxes are known once it
// answers. done says how it ended: one that failed took nothing; one that
// succeeded names what it made (a create's sandbox, a fork share's
// children) and counts until the node's capacity names them, or until a
// capacity read after it answered does not (they went meanwhile).
func (p *pending) add(node, id string, mib int64) (done func(ok bool, ids ...string)) {
	return p.addShare(node, id, 1, mib)
}

// addShare is add for n sandboxes of each MiB made in one call (a fork's
// share on one node).
func (p *pending) addShare(node, id string, n int, each int64) (done func(ok bool, ids ...string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string][]placed{}
	}
	p.seq++
	seq := p.seq
	p.m[node] = append(p.m[node], placed{seq: seq, id: id, mib: int64(n) * each, each: each})
	return func(ok bool, ids ...string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		i := slices.IndexFunc(p.m[node], func(x placed) bool { return x.seq == seq })
		if i < 0 {
			return
		}
		x := p.m[node][i]
		p.m[node] = slices.Delete(p.m[node], i, i+1)
		if !ok {
			return
		}
		x.done = p.clock()
		if x.id != "" || len(ids) == 0 {
			p.m[node] = append(p.m[node], x)
			return
		}
		// One entry for each sandbox it made.
		for _, sid := range ids {
			y := x
			y.id, y.mib = sid, x.each
			p.m[node] = append(p.m[node], y)
		}
	}
}

// of is the memory this node sent to node n that n's capacity (as read)
// does not count yet, and forgets what it counts:
//   - a sandbox the capacity names (Admits) is counted there, not here;
//   - one that answered before the capacity was read (RefreshedAt) and is
//     not named holds no memory now (removed, or put to sleep);
//   - a create still in flight (its sandbox not known here yet) may be
//     counted there already, as one of the sandboxes being made that
//     nothing here names (Starting): those creates count here only for
//     what exceeds them. A create is then never counted twice; while
//     another node's or a local create is being made on n too, one of
//     this node's in flight may count as that one until it answers (n's
//     own admission has the last word).
func (p *pending) of(n api.Node) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	xs := p.m[n.Name]
	if len(xs) == 0 {
		return 0
	}
	named := map[string]bool{}
	for _, id := range n.Capacity.Admits {
		named[id] = true
	}
	starting := map[string]bool{}
	for _, id := range n.Capacity.Starting {
		starting[id] = true
	}
	var count, inFlight, known int64
	keep := xs[:0]
	for _, x := range xs {
		switch {
		case x.id != "" && named[x.id]:
			if !starting[x.id] {
				continue // counted there from now on
			}
			x.named = true
			known += x.mib
		case x.id != "" && (x.named || !x.done.IsZero() && n.RefreshedAt.After(x.done)):
			continue // no longer holds memory there
		case x.id != "":
			count += x.mib
		default:
			inFlight += x.mib
		}
		keep = append(keep, x)
	}
	p.m[n.Name] = keep
	others := max(0, n.Capacity.MemoryStartingMiB-known)
	return count + max(0, inFlight-others)
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
	// MemAvailable falls only as a sandbox touches its memory: what is
	// being made or woken there (its admission holds it until it runs)
	// and what its capacity does not count yet are taken, as its own
	// admission takes them.
	free := c.MemAvailableMiB - c.MemoryFloorMiB - c.MemoryStartingMiB - pendingMiB - mib
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
