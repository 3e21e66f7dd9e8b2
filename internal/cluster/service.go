package cluster

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/remote"
	"github.com/clade-sandbox/clade/sdk"
)

// Service is a cluster node's service.Service: the node's own (local),
// with names checked cluster-wide, the directory written as its sandboxes
// change, and calls on a sandbox another node holds sent to that node's
// API (service/remote, with the cluster token). A fork goes to the node
// that holds its source, and may place its children across the nodes
// (fork.go); a snapshot's get and remove go to its node (snapdir.go).
// Other calls that are not on one sandbox (images, volumes, secrets, the
// snapshot list, events) are the node's own.
type Service struct {
	service.Service
	c *Cluster

	mu      sync.Mutex
	remotes map[string]*remote.Service // by address; guarded by mu
	routes  map[string]route           // by sandbox id; guarded by mu

	pending pending

	moves *moves // moves of sleeping sandboxes (move.go)
	forks *forks // forks across nodes and the internal routes (fork.go)

	// copied is signalled (CopyMade) when a copy in the object store is
	// sealed: Sync then writes the records waiting for it at once.
	copied chan struct{}
}

var (
	_ service.Service = (*Service)(nil)
	_ service.Nodes   = (*Service)(nil)
)

// NewService wraps local, the node's own service, for the cluster c.
func NewService(c *Cluster, local service.Service) *Service {
	s := &Service{Service: local, c: c, remotes: map[string]*remote.Service{}, routes: map[string]route{}, copied: make(chan struct{}, 1)}
	s.moves = &moves{c: c, local: local, pending: &s.pending, svc: s}
	s.forks = &forks{c: c, local: local, pending: &s.pending, svc: s}
	return s
}

// CopyMade tells the service that a copy of this node's in the object
// store was sealed: a sleeping sandbox's record that waits for its image's
// copy is written again at once (Sync), so that another node may wake it
// now rather than after the next second's pass. It never blocks.
func (s *Service) CopyMade() {
	select {
	case s.copied <- struct{}{}:
	default: // one already pending covers this one
	}
}

// Nodes reads the cluster's live nodes.
func (s *Service) Nodes(ctx context.Context) ([]api.Node, error) { return s.c.Nodes(ctx) }

// Drain marks or unmarks a node as draining (no new placements); a
// drain also gives the node's sleeping sandboxes in the snapshot store to
// other nodes at once (move.go), and the drained node itself then moves
// its idle running ones off while the mark stays (drain.go).
func (s *Service) Drain(ctx context.Context, node string, on bool) (api.Node, error) {
	n, err := s.c.Drain(ctx, node, on)
	if err != nil || !on {
		return n, err
	}
	moved, err := s.moves.drainSleeping(ctx, node)
	if err != nil {
		s.c.cfg.Log.Warn("cluster: drain: some sleeping sandboxes stay on the node", "node", node, "err", err)
	}
	if moved > 0 {
		s.c.cfg.Log.Info("cluster: drain: sleeping sandboxes given to other nodes", "node", node, "sandboxes", moved)
	}
	return n, nil
}

// Sync writes the records of every sandbox the node holds, drops the
// records that name this node for sandboxes it no longer has, and then
// follows the node's events, writing each change, until ctx ends.
func (s *Service) Sync(ctx context.Context) error {
	sub, err := s.Service.SubscribeEvents(ctx, 0, false, service.EventFilter{})
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := s.resync(ctx); err != nil {
		s.c.cfg.Log.Warn("cluster: write the directory", "err", err)
	}
	// While this node is drained, it moves its sandboxes off (drain.go).
	drainDone := make(chan struct{})
	defer func() { <-drainDone }()
	dctx, stopDrain := context.WithCancel(ctx)
	defer stopDrain()
	go func() {
		defer close(drainDone)
		s.moves.drainLoop(dctx)
	}()
	// A full pass now and then mends what a write etcd refused missed.
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	// Sandboxes of nodes that left are marked lost by whichever node
	// looks first.
	lost := time.NewTicker(time.Second)
	defer lost.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.Done():
			return sub.Err()
		case <-lost.C:
			if _, err := s.c.MarkLost(ctx); err != nil {
				s.c.cfg.Log.Debug("cluster: mark lost sandboxes", "err", err)
			}
			s.moves.republishCopied(ctx)
		case <-s.copied:
			s.moves.republishCopied(ctx)
		case <-s.c.rejoined:
			// Back after its lease lapsed: what the cluster took from
			// it meanwhile is stopped and cleaned now.
			s.c.cfg.Log.Warn("cluster: rejoined after the lease lapsed; checking what this node holds against the directory")
			if err := s.resync(ctx); err != nil {
				s.c.cfg.Log.Warn("cluster: write the directory", "err", err)
			}
		case <-t.C:
			if err := s.resync(ctx); err != nil {
				s.c.cfg.Log.Warn("cluster: write the directory", "err", err)
			}
		case ev := <-sub.C():
			if !recordEvents[ev.Type] {
				// An exec, a snapshot, a refused admission: nothing the
				// directory holds changed (and etcd is not even read).
				continue
			}
			ids := ev.Children
			if ev.Sandbox != "" {
				ids = append(ids, ev.Sandbox)
			}
			for _, id := range ids {
				if err := s.publishID(ctx, id); err != nil {
					s.c.cfg.Log.Warn("cluster: write a sandbox's record", "sandbox", id, "event", ev.Type, "err", err)
				}
			}
		}
	}
}

// publishID writes (or, for a sandbox that is gone, removes) id's record.
func (s *Service) publishID(ctx context.Context, id string) error {
	sb, err := s.Service.Get(ctx, id)
	if errdefs.IsNotFound(err) {
		err := s.c.Unpublish(ctx, id, false)
		if errors.Is(err, errNotHolder) {
			// This node's copy went because the cluster gave the
			// sandbox to another node (fenced, or a move): the record
			// is that node's, nothing of this node's to drop.
			return nil
		}
		return err
	}
	if err != nil {
		return err
	}
	if transitional[sb.State] {
		// The record changes at stable states only: a create writes
		// once (running), a sleep once (sleeping).
		return nil
	}
	return s.publish(ctx, sb)
}

// recordEvents are the events that may change a sandbox's record.
var recordEvents = map[string]bool{api.EventCreated: true, api.EventStarted: true, api.EventForked: true, api.EventSlept: true,
	api.EventWoken: true, api.EventStopped: true, api.EventRemoved: true}

// transitional are the states a sandbox passes through; its record is
// written at the state it reaches (a create, killed midway, leaves none).
var transitional = map[string]bool{"creating": true, "suspending": true, "waking": true, "destroying": true}

// publish writes sb's record; a record the cluster took from this node
// (fenced) makes the node stop and remove the sandbox: it must not run
// what the cluster says is lost or elsewhere.
func (s *Service) publish(ctx context.Context, sb api.Sandbox) error {
	err := s.publishImage(ctx, sb)
	if !errors.Is(err, errFenced) {
		return err
	}
	if rec, ok, lerr := s.c.Lookup(ctx, sb.ID); lerr == nil && ok && rec.ID == sb.ID && rec.State != StateLost && givenBack(ctx, s.moves, rec) {
		// Given away and back, its image the one here: this node's.
		return s.publishImage(ctx, sb)
	}
	s.c.cfg.Log.Warn("cluster: fenced: stopping and removing a sandbox the cluster no longer gives this node", "sandbox", sb.ID, "err", err)
	// Its copy in the snapshot store stays: a node it moved to uses it.
	if rerr := s.moves.disown(ctx, sb.ID); rerr != nil && !errdefs.IsNotFound(rerr) {
		return errors.Join(err, rerr)
	}
	return nil
}

func (s *Service) resync(ctx context.Context) error {
	sbs, err := s.Service.List(ctx)
	if err != nil {
		return err
	}
	recs, err := s.c.Records(ctx)
	if err != nil {
		return err
	}
	var errs []error
	have := map[string]bool{}
	for _, sb := range sbs {
		have[sb.ID] = true
		if transitional[sb.State] {
			continue
		}
		// The record holds Get's view (List's is shorter): the same
		// view as every other write, so an unchanged sandbox is not
		// written again.
		if got, err := s.Service.Get(ctx, sb.ID); err == nil {
			sb = got
		}
		if err := s.publish(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range recs {
		if r.Node == s.c.cfg.Node && !have[r.ID] && !s.forks.importing.has(r.ID) && !s.moves.keepUnheld(ctx, r) {
			errs = append(errs, s.c.Unpublish(ctx, r.ID, false))
		}
	}
	return errors.Join(errs...)
}

// Create places the sandbox (see place), or makes it on the node the
// request names.
func (s *Service) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	switch {
	case req.Node == s.c.cfg.Node:
		req.Node = ""
		return s.createHere(ctx, req)
	case req.Node != "":
		n, live, err := s.c.node(ctx, req.Node)
		if err != nil {
			return api.Sandbox{}, err
		}
		if !live {
			return api.Sandbox{}, errdefs.New(errdefs.NotFound, "node %q is not in the cluster (clade node ls lists the live nodes)", req.Node)
		}
		return s.createOn(ctx, n, req)
	case req.FromSnapshot != "" || len(req.Volumes) > 0 || len(req.Secrets) > 0:
		// Snapshots, volumes and secrets are still each node's own: the
		// create stays where they are.
		return s.createHere(ctx, req)
	}
	return s.place(ctx, req)
}

// place sends the create to the best of K candidates by memory free after
// admission, among the live nodes that are not draining, run its engine
// and hold its image; a node that refuses for memory (its capacity moved
// since its last refresh) passes it to the next. A cluster where every
// candidate refuses answers the best one's refusal: the retryable 503 of one
// node.
func (s *Service) place(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	nodes, err := s.c.Nodes(ctx)
	if err != nil {
		return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "cluster: cannot place the sandbox: %v", err)
	}
	cs := rank(nodes, req, s.pending.of, defaultRand)
	if len(cs) == 0 {
		return api.Sandbox{}, errdefs.New(errdefs.Unavailable,
			"no node of the cluster can take this sandbox now: none of the %d live nodes is both not draining and running engine %q (clade node ls); try again later", len(nodes), cmpOr(req.Engine, "(default)"))
	}
	var first error
	for _, c := range cs {
		sb, err := s.createOn(ctx, c.node, req)
		if err == nil || !errdefs.IsUnavailable(err) {
			return sb, err
		}
		s.c.cfg.Log.Info("cluster: a node refused a placed create", "node", c.node.Name, "free_mib", c.free, "err", err)
		if first == nil {
			first = err // the best candidate's refusal says most
		}
	}
	return api.Sandbox{}, first
}

// createOn makes the sandbox on node n: here, or through n's API (where it
// is made on n itself).
func (s *Service) createOn(ctx context.Context, n api.Node, req api.CreateSandboxRequest) (api.Sandbox, error) {
	done := s.pending.add(n.Name, "", cmpInt(int64(req.MemoryMiB), n.Capacity.DefaultMemoryMiB))
	var sb api.Sandbox
	var err error
	if n.Name == s.c.cfg.Node {
		req.Node = ""
		sb, err = s.createHere(ctx, req)
	} else {
		var r *remote.Service
		if r, err = s.remote(n); err == nil {
			req.Node = n.Name
			sb, err = r.Create(ctx, req)
		}
	}
	done(err == nil, sb.ID)
	return sb, err
}

// createHere checks the name cluster-wide, makes the sandbox on this node
// and writes its record before it answers: any node finds it from then on.
func (s *Service) createHere(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	if req.Name != "" {
		release, err := s.c.ReserveName(ctx, req.Name)
		if err != nil {
			return api.Sandbox{}, err
		}
		defer release()
	}
	sb, err := s.Service.Create(ctx, req)
	if err != nil {
		return sb, err
	}
	sb.Node = s.c.cfg.Node
	// The record holds the node's view as Get gives it, as the events'
	// writes do: the same sandbox is never written twice for a view that
	// differs only in what a create's answer adds.
	view := sb
	if got, err := s.Service.Get(ctx, sb.ID); err == nil {
		view = got
	}
	if err := s.publish(ctx, view); err != nil {
		s.c.cfg.Log.Warn("cluster: write a new sandbox's record", "sandbox", sb.ID, "err", err)
	}
	return sb, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func cmpInt(a, b int64) int64 {
	if a > 0 {
		return a
	}
	return max(b, 512)
}

// List is the node's sandboxes and, from the directory, the other live
// nodes' (without what stays on their node: environment, traffic token).
// A move's window is listed once, by its record: a sandbox given to this
// node that it has not adopted yet (sleeping here, or moving while it is
// fetched) is listed though the node does not have it, and this node's
// copy of one given to another node (fenced, removed at its next check)
// is not.
func (s *Service) List(ctx context.Context) ([]api.Sandbox, error) {
	own, err := s.Service.List(ctx)
	if err != nil {
		return nil, err
	}
	self := s.c.cfg.Node
	for i := range own {
		own[i].Node = self
	}
	recs, err := s.c.Records(ctx)
	if err != nil {
		s.c.cfg.Log.Warn("cluster: list without the other nodes", "err", err)
		return own, nil
	}
	elsewhere := map[string]bool{} // given to another node
	for _, r := range recs {
		if r.Node != self && r.State != StateLost {
			elsewhere[r.ID] = true
		}
	}
	have := map[string]bool{}
	out := own[:0]
	for _, sb := range own {
		if !elsewhere[sb.ID] {
			have[sb.ID] = true
			out = append(out, sb)
		}
	}
	for _, r := range recs {
		if have[r.ID] {
			continue
		}
		// (A fork's child this node imports is listed by its record
		// until the node has it; an importing record of this node that
		// it is not importing, left by its earlier run killed mid-import,
		// is not listed: its first pass removes it.)
		importing := r.State == StateImporting && s.forks.importing.has(r.ID)
		given := r.Node == self && (r.State == StateMoving || importing || movable(r) && r.Epoch > s.c.epoch(r.ID))
		if r.Node != self || r.State == StateLost || given {
			sb := r.Sandbox
			sb.ID, sb.Node, sb.State, sb.Name, sb.SleepImage = r.ID, r.Node, r.State, r.Name, r.SleepImage
			out = append(out, sb)
		}
	}
	slices.SortStableFunc(out, func(a, b api.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// route picks the service that holds ref: this node's when it has it,
// else the node the directory names.
func (s *Service) route(ctx context.Context, ref string) (service.Service, error) {
	if s.Service.Running(ref) {
		return s.Service, nil
	}
	// A route found lately: no read of this node's database (a miss)
	// nor of etcd. Only ids of other nodes' sandboxes are cached.
	if n, ok := s.cachedRoute(ref); ok {
		return s.remote(n)
	}
	if sb, err := s.Service.Get(ctx, ref); err == nil && sb.State == "sleeping" && s.moves.movedAway(ctx, sb.ID) {
		// Moved to another node meanwhile: this node's copy is gone now;
		// the record says where it is.
		s.forgetRoute(sb.ID)
	} else if err == nil || !errdefs.IsNotFound(err) {
		return s.Service, nil // here, or an error of this node's to tell
	}
	rec, ok, err := s.c.Lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if ok && rec.State == StateLost {
		return nil, lostError(rec)
	}
	if ok && rec.State == StateImporting {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s is a fork's child that node %s is still importing (fetching the snapshot): try again once it is running", rec.ID, rec.Node)
	}
	if ok && (movable(rec) || rec.State == StateMoving) {
		if svc, moved, err := s.moves.routeSleeping(ctx, ref, rec); moved || err != nil {
			return svc, err
		}
		if rec, ok, err = s.c.Lookup(ctx, rec.ID); err != nil {
			return nil, err
		}
	}
	if !ok || rec.Node == s.c.cfg.Node {
		return s.Service, nil // the node's own NotFound
	}
	n, live, err := s.c.node(ctx, rec.Node)
	if err != nil {
		return nil, err
	}
	if !live {
		if rec.State == "sleeping" {
			return nil, errdefs.New(errdefs.Unavailable, "sandbox %s sleeps on node %s, which is not in the cluster now (its lease lapsed), and wakes only there: %s; try again when it is back", rec.ID, rec.Node, whyNotMovable)
		}
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s is on node %s, which is not in the cluster now (its lease lapsed): try again when it is back", rec.ID, rec.Node)
	}
	if rec.ID == ref {
		s.cacheRoute(ref, n)
	}
	return s.remote(n)
}

// routeTTL is how long a call on a sandbox of another node reuses the
// directory's answer: a burst of execs reads etcd once. A node that left
// is noticed within it; a call sent to a node a sleeping sandbox moved off
// meanwhile is forwarded on by that node (it finds the record moved).
const routeTTL = 2 * time.Second

type route struct {
	node api.Node
	at   time.Time
}

func (s *Service) cachedRoute(id string) (api.Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.routes[id]
	if !ok || time.Since(r.at) > routeTTL {
		delete(s.routes, id)
		return api.Node{}, false
	}
	return r.node, true
}

func (s *Service) cacheRoute(id string, n api.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.routes) > 10000 {
		clear(s.routes)
	}
	s.routes[id] = route{node: n, at: time.Now()}
}

func (s *Service) forgetRoute(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.routes, id)
}

func (s *Service) remote(n api.Node) (*remote.Service, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.remotes[n.Addr]; ok {
		return r, nil
	}
	c, err := peerClient(n, s.c.cfg.Token)
	if err != nil {
		return nil, err
	}
	r := remote.New(c, n.Name)
	s.remotes[n.Addr] = r
	return r, nil
}

// peerDeadTimeout is how long a call to another node waits on a link that
// went silent (a partition, a vanished host) before it fails: the kernel
// alone would retransmit for ~15 minutes, and a call through n1 on a
// sandbox of a cut-off n3 would hang that long instead of failing until
// n3's lease lapses and n1 answers "lost" itself.
const peerDeadTimeout = 10 * time.Second

// peerClient is a new SDK client of node n's API with the cluster token.
func peerClient(n api.Node, token string) (*sdk.Client, error) {
	host := n.Addr
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	c, err := sdk.New(host, sdk.WithToken(token), sdk.WithDeadPeerTimeout(peerDeadTimeout))
	if err != nil {
		return nil, errdefs.New(errdefs.Unavailable, "node %s's address %q: %v", n.Name, n.Addr, err)
	}
	return c, nil
}

// lostRecord is the record of ref when the directory says it is lost.
func (s *Service) lostRecord(ctx context.Context, ref string) (Record, bool) {
	rec, ok, err := s.c.Lookup(ctx, ref)
	return rec, err == nil && ok && rec.State == StateLost
}

// Get answers a lost sandbox with its record: state lost and the reason.
func (s *Service) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if errdefs.Is(err, errdefs.Conflict) {
		if rec, lost := s.lostRecord(ctx, ref); lost {
			sb := rec.Sandbox
			sb.ID, sb.Node, sb.State, sb.Name, sb.Error = rec.ID, rec.Node, rec.State, rec.Name, rec.Reason
			return sb, nil
		}
	}
	if errdefs.IsUnavailable(err) {
		// A fork's child being imported: its record.
		if rec, ok, lerr := s.c.Lookup(ctx, ref); lerr == nil && ok && rec.State == StateImporting {
			sb := rec.Sandbox
			sb.ID, sb.Node, sb.State = rec.ID, rec.Node, rec.State
			return sb, nil
		}
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := svc.Get(ctx, ref)
	if err == nil && svc == s.Service {
		sb.Node = s.c.cfg.Node
		sb.SleepImage = s.moves.sleepImage(ctx, sb)
	}
	return sb, err
}

// Remove removes the sandbox where it is; this node drops the record of
// one it held at once (the holder of another does). A fork's child that
// a node is still importing is removed once the import made it: the
// remove waits for it (at most importWait), changing nothing meanwhile,
// so that a node killed during the wait leaves nothing half done (the
// child is made and stays, or its import fails and its record goes); a
// child whose import failed is not there, as asked (nil). So is one this
// node imports: its local record (creating while it is restored) is the
// fork's until the import settles, and a remove that took it then would
// drop the child's importing record and remove a sandbox the fork still
// makes (and then names, and writes the record of).
func (s *Service) Remove(ctx context.Context, ref string) error {
	if s.forks.importing.has(ref) {
		if _, made, err := s.c.AwaitImported(ctx, ref, importWait); err != nil || !made {
			return err
		}
	}
	svc, err := s.route(ctx, ref)
	if errdefs.IsUnavailable(err) {
		if rec, ok, lerr := s.c.Lookup(ctx, ref); lerr == nil && ok && rec.State == StateImporting {
			_, made, err := s.c.AwaitImported(ctx, rec.ID, importWait)
			if err != nil || !made {
				return err
			}
			return s.Remove(ctx, rec.ID)
		}
	}
	if errdefs.Is(err, errdefs.Conflict) {
		// A lost sandbox: its record goes (its node, should it come
		// back, has cleaned or will clean what it had).
		if rec, lost := s.lostRecord(ctx, ref); lost {
			return s.c.Unpublish(ctx, rec.ID, true)
		}
	}
	if err != nil {
		return err
	}
	if svc != s.Service {
		s.forgetRoute(ref)
		return svc.Remove(ctx, ref)
	}
	sb, err := s.Service.Get(ctx, ref)
	if err != nil {
		return err
	}
	// The record goes first: a drain (or a room refusal's give) racing
	// the remove can then not give the sandbox to another node while the
	// remove drops its image from the store (the record would name a
	// removed sandbox that no node can wake). A remove that fails after
	// is written again by the node's next pass.
	if err := s.c.Unpublish(ctx, sb.ID, true); errors.Is(err, errNotHolder) && sb.State == "sleeping" {
		// Given away meanwhile: this copy is stale (its object stays for
		// the node it was given to), and the remove goes there.
		if derr := s.moves.disown(ctx, sb.ID); derr != nil && !errdefs.IsNotFound(derr) {
			return derr
		}
		s.forgetRoute(sb.ID)
		svc, err := s.route(ctx, sb.ID)
		if err != nil {
			return err
		}
		if svc == s.Service {
			return nil
		}
		return svc.Remove(ctx, sb.ID)
	} else if err != nil {
		s.c.cfg.Log.Warn("cluster: remove a sandbox's record", "sandbox", sb.ID, "err", err)
	}
	return s.Service.Remove(ctx, ref)
}

func (s *Service) Sleep(ctx context.Context, ref string) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.Sleep(ctx, ref)
}

func (s *Service) SleepFiles(ctx context.Context, ref string) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.SleepFiles(ctx, ref)
}

func (s *Service) Wake(ctx context.Context, ref string) (api.Sandbox, error) {
	return s.wake(ctx, ref, true)
}

// wake wakes ref on the node the record names; elsewhere lets a node's
// refusal for room give it to another node (a plain wake), which a wake
// asked for on a named node (WakeOn) must not do.
func (s *Service) wake(ctx context.Context, ref string, elsewhere bool) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	held := ""
	if svc == s.Service {
		if held, svc, err = s.holdWake(ctx, ref); err != nil {
			return api.Sandbox{}, err
		}
	}
	sb, err := svc.Wake(ctx, ref)
	if held != "" {
		s.moves.waking.Delete(held)
		if err != nil {
			// Still asleep here: its record names its image again.
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			if got, gerr := s.Service.Get(pctx, held); gerr == nil {
				if perr := s.publish(pctx, got); perr != nil {
					s.c.cfg.Log.Warn("cluster: write the record of a sandbox whose wake failed", "sandbox", held, "err", perr)
				}
			}
			cancel()
		}
	}
	if err != nil && elsewhere && svc != s.Service {
		if other, ok := s.moves.wakeElsewhere(ctx, ref, err); ok {
			return other.Wake(ctx, ref)
		}
	}
	if err == nil && svc == s.Service {
		sb.Node = s.c.cfg.Node // as Get answers it (WakeOn compares it)
		// Written before the answer (not only from the event): a record
		// that still said asleep would name an image the wake dropped.
		// Bounded: etcd out of reach must not hold a local wake long.
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		view := sb // Get's view, as every other write (no second write for the event)
		if got, gerr := s.Service.Get(pctx, sb.ID); gerr == nil {
			view = got
		}
		if perr := s.publish(pctx, view); perr != nil {
			s.c.cfg.Log.Warn("cluster: write a woken sandbox's record", "sandbox", sb.ID, "err", perr)
		}
	}
	return sb, err
}

// publishImage writes sb's record naming its sleep image, read and written
// under the image lock (moves.lockImage): one step against a wake's hold.
// The lock is not held across a fenced sandbox's removal.
func (s *Service) publishImage(ctx context.Context, sb api.Sandbox) error {
	unlock := s.moves.lockImage(sb.ID)
	defer unlock()
	return s.c.PublishImage(ctx, sb, s.moves.sleepImage(ctx, sb))
}

// holdWake, before this node wakes its sandbox ref, makes the record
// name no image until the wake's write (moves.waking; Cluster.holdWake):
// no other node may take the sandbox (a wake --node there) and wake its
// image while this node runs it. It returns the id held ("" for none:
// not asleep here, or etcd out of reach, when the node serves its own),
// and the service to wake it through: another node's when the record was
// given away after the call was routed (this node's copy is then gone).
func (s *Service) holdWake(ctx context.Context, ref string) (string, service.Service, error) {
	sb, err := s.Service.Get(ctx, ref)
	if err != nil || sb.State != "sleeping" {
		return "", s.Service, nil
	}
	// Bounded: etcd out of reach must not hold a local wake long.
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// Under the image lock: a write of the record whose image was read
	// before the mark lands first (and is cleared), any later one reads
	// none.
	unlock := s.moves.lockImage(sb.ID)
	s.moves.waking.Store(sb.ID, true)
	mine, err := s.c.holdWake(hctx, sb.ID)
	unlock()
	if err != nil {
		s.c.cfg.Log.Warn("cluster: keep a waking sandbox's record from other nodes", "sandbox", sb.ID, "err", err)
	}
	if mine {
		return sb.ID, s.Service, nil
	}
	s.moves.waking.Delete(sb.ID)
	s.moves.movedAway(ctx, sb.ID)
	svc, err := s.route(ctx, ref)
	return "", svc, err
}

func (s *Service) SetTimeout(ctx context.Context, ref string, req api.TimeoutRequest) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.SetTimeout(ctx, ref, req)
}

func (s *Service) Exec(ctx context.Context, ref string, wake service.WakeMode, req api.ExecRequest) (service.Process, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Exec(ctx, ref, wake, req)
}

func (s *Service) SupportsUser(ctx context.Context, ref string, wake service.WakeMode) (bool, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return false, err
	}
	return svc.SupportsUser(ctx, ref, wake)
}

func (s *Service) Kept(ctx context.Context, ref string, wake service.WakeMode) ([]api.KeptCommand, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Kept(ctx, ref, wake)
}

func (s *Service) Attach(ctx context.Context, ref string, wake service.WakeMode, pid int, stdin bool) (service.Process, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Attach(ctx, ref, wake, pid, stdin)
}

func (s *Service) Stat(ctx context.Context, ref string, wake service.WakeMode, path string) (service.FileInfo, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return service.FileInfo{}, err
	}
	return svc.Stat(ctx, ref, wake, path)
}

func (s *Service) CopyOut(ctx context.Context, ref string, wake service.WakeMode, path string) (io.ReadCloser, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.CopyOut(ctx, ref, wake, path)
}

func (s *Service) CopyIn(ctx context.Context, ref string, wake service.WakeMode, path, user string, r io.Reader) error {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return err
	}
	return svc.CopyIn(ctx, ref, wake, path, user, r)
}

func (s *Service) Xattrs(ctx context.Context, ref string, wake service.WakeMode, prefix string, paths []string) ([]map[string]string, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Xattrs(ctx, ref, wake, prefix, paths)
}

func (s *Service) SetXattrs(ctx context.Context, ref string, wake service.WakeMode, path, prefix string, attrs map[string]string) error {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return err
	}
	return svc.SetXattrs(ctx, ref, wake, path, prefix, attrs)
}

func (s *Service) Dial(ctx context.Context, ref string, wake service.WakeMode, port int) (net.Conn, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	conn, err := svc.Dial(ctx, ref, wake, port)
	if err != nil && svc != s.Service && wake == service.Wake {
		if other, ok := s.moves.wakeElsewhere(ctx, ref, err); ok {
			return other.Dial(ctx, ref, wake, port)
		}
	}
	return conn, err
}

func (s *Service) Ready(ctx context.Context, ref string, wake service.WakeMode) (any, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Ready(ctx, ref, wake)
}

func (s *Service) Stats(ctx context.Context, ref string) (api.SandboxStats, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.SandboxStats{}, err
	}
	return svc.Stats(ctx, ref)
}

func (s *Service) SetNetwork(ctx context.Context, ref string, n api.Network) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.SetNetwork(ctx, ref, n)
}

func (s *Service) ChangeNetwork(ctx context.Context, ref string, ch api.NetworkChange) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.ChangeNetwork(ctx, ref, ch)
}

// SubscribeEvents follows this node's events, each saying the node (the
// events of other nodes are theirs to serve; Across merges them).
func (s *Service) SubscribeEvents(ctx context.Context, since uint64, hasSince bool, f service.EventFilter) (service.Subscription, error) {
	sub, err := s.Service.SubscribeEvents(ctx, since, hasSince, f)
	if err != nil {
		return nil, err
	}
	ns := &nodeSub{Subscription: sub, node: s.c.cfg.Node, c: make(chan api.Event)}
	go ns.run()
	return ns, nil
}

// nodeSub is a subscription whose events carry the node.
type nodeSub struct {
	service.Subscription
	node string
	c    chan api.Event
}

func (s *nodeSub) Backlog() []api.Event {
	b := s.Subscription.Backlog()
	for i := range b {
		b[i].Node = s.node
	}
	return b
}

func (s *nodeSub) C() <-chan api.Event { return s.c }

func (s *nodeSub) run() {
	for {
		select {
		case ev := <-s.Subscription.C():
			ev.Node = s.node
			select {
			case s.c <- ev:
			case <-s.Subscription.Done():
				return
			}
		case <-s.Subscription.Done():
			return
		}
	}
}

// EventsSince is this node's kept events after since, each saying the
// node.
func (s *Service) EventsSince(ctx context.Context, since uint64, f service.EventFilter) ([]api.Event, error) {
	evs, err := s.Service.EventsSince(ctx, since, f)
	for i := range evs {
		evs[i].Node = s.c.cfg.Node
	}
	return evs, err
}
