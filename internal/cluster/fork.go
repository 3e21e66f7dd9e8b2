package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/deadpeer"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/remote"
)

// Porter is the node's lifecycle side of a fork across nodes
// (sandbox.Porter, adapted in internal/system).
type Porter interface {
	// Export readies source (a snapshot, or a running sandbox snapshotted
	// now) for n children on other nodes until release.
	Export(ctx context.Context, source string, n int) (api.SnapshotExport, func(), error)
	// Open is the directory of an exported image, to stream.
	Open(digest string) (dir string, release func(), err error)
	// Import fetches (with fetch, into a new dir) and verifies the
	// snapshot, and forks n children of it here; a node without the root
	// meta.ImageID of its image opens it with fetchRoot (a root stream).
	// The children's ids are picked first and given to reserve (when not
	// nil) before anything is fetched; a reserve that fails ends it.
	Import(ctx context.Context, meta api.SnapshotExport, n int, fetch func(ctx context.Context, dir string) error,
		fetchRoot func(ctx context.Context, id string) (io.ReadCloser, error), reserve func(ids []string) error) (api.ForkResult, error)
	// SendRoot writes the image root with identity id as a root stream
	// to the writer w returns (called once the root is found): NotFound
	// if this node holds no such root.
	SendRoot(ctx context.Context, id string, w func() io.Writer) error
}

// forks is the part of Service that forks across nodes: it owns the
// porter (the lifecycle's export and import of a snapshot) and serves the
// internal routes other nodes call. It takes the cluster, the node's own
// service and the creates in flight (placement), and calls back into the
// Service through forkOps.
type forks struct {
	c       *Cluster
	local   service.Service
	pending *pending
	svc     forkOps

	// porter, when set (SetPorter), makes forks across nodes.
	porter Porter
	// importing are the children this node is importing (importing.go).
	importing imports
}

// forkOps is what a fork calls back into the node's Service for: a
// child's record written, another node's API.
type forkOps interface {
	publishID(ctx context.Context, id string) error
	remote(n api.Node) (*remote.Service, error)
}

// SetPorter enables forks across nodes on this node.
func (s *Service) SetPorter(p Porter) { s.forks.porter = p }

// importRequest is the body of POST /v1/internal/fork/import.
type importRequest struct {
	Snapshot api.SnapshotExport `json:"snapshot"`
	N        int                `json:"n"`
	// Origin is the node to fetch the image from (its address is read
	// from the directory, never taken from the request).
	Origin string `json:"origin"`
}

// Fork is ForkAcross without a spread.
func (s *Service) Fork(ctx context.Context, source string, n int) (api.ForkResult, error) {
	return s.ForkAcross(ctx, api.ForkRequest{Source: source, N: n})
}

// ForkAcross forks on the node that holds the source (a sandbox, or a
// snapshot: found here, else in the directory). There the fork stays on
// the node, as a fork of one node does (its children share the snapshot's
// memory), unless the request asks for the spread or the node's admission
// refuses them all; then the node snapshots once and places the children
// across the nodes (spread).
func (s *Service) ForkAcross(ctx context.Context, req api.ForkRequest) (api.ForkResult, error) {
	return s.forks.fork(ctx, req)
}

// fork is ForkAcross.
func (f *forks) fork(ctx context.Context, req api.ForkRequest) (api.ForkResult, error) {
	if req.Source == "" {
		return api.ForkResult{}, errdefs.New(errdefs.InvalidArgument, "source is empty: name a snapshot or a running sandbox")
	}
	if req.N < 1 {
		return api.ForkResult{}, errdefs.New(errdefs.InvalidArgument, "n must be at least 1")
	}
	here, err := f.holdsSource(ctx, req.Source)
	if err != nil {
		return api.ForkResult{}, err
	}
	if !here {
		n, err := f.sourceNode(ctx, req.Source)
		if err != nil {
			return api.ForkResult{}, err
		}
		r, err := f.svc.remote(n)
		if err != nil {
			return api.ForkResult{}, err
		}
		return r.ForkAcross(ctx, req)
	}
	if req.Spread && f.porter == nil {
		return api.ForkResult{}, errdefs.New(errdefs.InvalidArgument, "node %s cannot fork across nodes", f.c.cfg.Node)
	}
	if !req.Spread {
		res, err := f.local.Fork(ctx, req.Source, req.N)
		if err == nil || f.porter == nil || !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "memory") {
			return f.settleLocal(ctx, res), err
		}
		f.c.cfg.Log.Info("cluster: this node has no room for the fork's children: placing them across the cluster", "source", req.Source, "n", req.N, "err", err)
	}
	return f.spread(ctx, req)
}

// holdsSource reports whether this node holds source (a sandbox or a
// snapshot).
func (f *forks) holdsSource(ctx context.Context, source string) (bool, error) {
	if _, err := f.local.Get(ctx, source); err == nil {
		return true, nil
	} else if !errdefs.IsNotFound(err) {
		return false, err
	}
	if _, err := f.local.GetSnapshot(ctx, source); err == nil {
		return true, nil
	} else if !errdefs.IsNotFound(err) {
		return false, err
	}
	return false, nil
}

// sourceNode is the live node that holds source, from the directory.
func (f *forks) sourceNode(ctx context.Context, source string) (api.Node, error) {
	holder := ""
	rec, ok, err := f.c.Lookup(ctx, source)
	if err != nil {
		return api.Node{}, err
	}
	if ok && rec.State == StateLost {
		return api.Node{}, lostError(rec)
	}
	if ok {
		holder = rec.Node
	} else {
		sr, ok, err := f.c.LookupSnapshot(ctx, source)
		if err != nil {
			return api.Node{}, err
		}
		if ok {
			holder = sr.Node
		}
	}
	if holder == "" || holder == f.c.cfg.Node {
		return api.Node{}, errdefs.New(errdefs.NotFound, "no snapshot or sandbox called %s in the cluster (see `clade snapshot ls` and `clade ls`)", source)
	}
	n, live, err := f.c.node(ctx, holder)
	if err != nil {
		return api.Node{}, err
	}
	if !live {
		return api.Node{}, errdefs.New(errdefs.Unavailable, "%s is on node %s, which is not in the cluster now (its lease lapsed): try again when it is back", source, holder)
	}
	return n, nil
}

// settleLocal names this node in a local fork's children and writes their
// records before the answer (the events' writes find them unchanged), so
// that any node finds them from then on.
func (f *forks) settleLocal(ctx context.Context, res api.ForkResult) api.ForkResult {
	for i := range res.Children {
		res.Children[i].Node = f.c.cfg.Node
		if id := res.Children[i].ID; id != "" {
			if err := f.svc.publishID(ctx, id); err != nil {
				f.c.cfg.Log.Warn("cluster: write a fork child's record", "sandbox", id, "err", err)
			}
		}
	}
	return res
}

// spread snapshots the source once (Export) and forks its children on
// the nodes placement picks, each node's share in one call: this node's
// with the local fork, another's through its internal import route (it
// fetches the image from here by digest, verifies it and restores).
func (f *forks) spread(ctx context.Context, req api.ForkRequest) (api.ForkResult, error) {
	meta, release, err := f.porter.Export(ctx, req.Source, req.N)
	if err != nil {
		return api.ForkResult{}, err
	}
	defer release()
	ctx = context.WithoutCancel(ctx) // children are made whole or not at all
	var plan, overflow []share
	if meta.Local != "" {
		f.c.cfg.Log.Info("cluster: the fork's children stay on this node", "snapshot", meta.ID, "why", meta.Local)
		plan = []share{{node: api.Node{Name: f.c.cfg.Node}, n: req.N}}
	} else if plan, overflow, err = f.planFork(ctx, meta, req.N, nil); err != nil {
		return api.ForkResult{}, err
	}
	res := api.ForkResult{Snapshot: meta.ID, Children: make([]api.ForkChild, 0, req.N)}
	outs, refusedBy := f.forkShares(ctx, meta, plan)
	// A share its node refused whole (no room after all: its capacity
	// was up to a second old, or another fork or create took it; its
	// disk floor) is placed again on the nodes that did not refuse,
	// before the fork gives up on those children.
	refused, again := map[string]bool{}, 0
	for i, sh := range plan {
		if meta.Local == "" && refusedBy[i] {
			refused[sh.node.Name] = true
			again += sh.n
		}
	}
	if again > 0 {
		plan2, over2, err := f.planFork(ctx, meta, again, refused)
		if err == nil {
			f.c.cfg.Log.Info("cluster: fork shares refused by their nodes are placed again", "snapshot", meta.ID, "children", again, "refused_by", slices.Sorted(maps.Keys(refused)))
			outs2, _ := f.forkShares(ctx, meta, plan2)
			for i, sh := range plan {
				if refused[sh.node.Name] {
					outs[i] = nil // placed again: their answers are the new shares'
				}
			}
			outs = append(outs, outs2...)
			overflow = append(overflow, over2...)
		}
	}
	last, _ := f.forkShares(ctx, meta, overflow)
	for _, o := range append(outs, last...) {
		res.Children = append(res.Children, o...)
	}
	return res, nil
}

// forkShares makes each share's children, all shares at once, and answers
// their entries by share, and which shares their node refused (see
// forkShare).
func (f *forks) forkShares(ctx context.Context, meta api.SnapshotExport, shares []share) ([][]api.ForkChild, []bool) {
	outs, refused := make([][]api.ForkChild, len(shares)), make([]bool, len(shares))
	var wg sync.WaitGroup
	for i, sh := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := f.pending.addShare(sh.node.Name, "", sh.n, cmpInt(int64(meta.MemoryMiB), 0))
			outs[i], refused[i] = f.forkShare(ctx, meta, sh)
			var made []string
			for _, c := range outs[i] {
				if c.ID != "" {
					made = append(made, c.ID)
				}
			}
			done(len(made) > 0, made...)
		}()
	}
	wg.Wait()
	return outs, refused
}

// share is a node's part of a fork: n children.
type share struct {
	node api.Node
	n    int
}

// forkShare makes sh's children and answers one entry for each; refused
// is whether the node refused the whole share with a retryable answer of
// its own (no room, its disk floor, another image root): another node may
// take it. A node that did not answer (gone, killed mid-import) may have
// made some of it: not refused.
func (f *forks) forkShare(ctx context.Context, meta api.SnapshotExport, sh share) (out []api.ForkChild, refused bool) {
	var res api.ForkResult
	var err error
	if sh.node.Name == f.c.cfg.Node {
		res, err = f.local.Fork(ctx, meta.ID, sh.n)
		res = f.settleLocal(ctx, res)
	} else {
		res, err = importOn(ctx, f.c.cfg.Token, sh.node, importRequest{Snapshot: meta, N: sh.n, Origin: f.c.cfg.Node})
	}
	if err == nil && len(res.Children) != sh.n {
		err = fmt.Errorf("node %s answered %d children for %d", sh.node.Name, len(res.Children), sh.n)
	}
	if err != nil {
		out := make([]api.ForkChild, sh.n)
		for i := range out {
			out[i] = api.ForkChild{Node: sh.node.Name, Error: fmt.Sprintf("node %s: %v", sh.node.Name, err), Code: string(errdefs.ClassOf(err))}
		}
		var na noAnswer
		return out, (errdefs.IsUnavailable(err) || errdefs.Is(err, errdefs.ResourceExhausted)) && !errors.As(err, &na)
	}
	for i := range res.Children {
		res.Children[i].Node = sh.node.Name
	}
	return res.Children, false
}

// noAnswer is an internal call the node did not answer (a transport
// error): it may have done part of the work.
type noAnswer struct{ error }

func (e noAnswer) Unwrap() error { return e.error }

// planFork places n children of meta: each on the node with the most
// memory free after admission, counting the children planned before it
// (so equal nodes take turns), among the live nodes that are not
// draining, run its engine and hold its image. Children no node has room
// for (overflow) go to the best node anyway, after the others, in a share
// of their own: that node's admission decides (its capacity in the
// directory is up to a second old), and its refusal says why. Nodes in
// except (they refused a share of this fork) are left out.
func (f *forks) planFork(ctx context.Context, meta api.SnapshotExport, n int, except map[string]bool) (plan, overflow []share, err error) {
	nodes, err := f.c.Nodes(ctx)
	if err != nil {
		return nil, nil, errdefs.New(errdefs.Unavailable, "cluster: cannot place the fork's children: %v", err)
	}
	req := api.CreateSandboxRequest{Image: meta.Image, Engine: meta.Engine, MemoryMiB: meta.MemoryMiB}
	var cs []candidate
	for _, nd := range nodes {
		if except[nd.Name] {
			continue
		}
		// A node without the image gets its root from the origin (the
		// import fetches it): only the engine and the drain count.
		if eligible(nd, req, false) || nd.Name == f.c.cfg.Node {
			cs = append(cs, candidate{node: nd, free: freeAfter(nd, int64(meta.MemoryMiB), f.pending.of(nd)) + int64(meta.MemoryMiB)})
		}
	}
	if len(cs) == 0 {
		return nil, nil, errdefs.New(errdefs.Unavailable, "no node of the cluster can take the fork's children now (clade node ls)")
	}
	// The owner first on a tie: its children share the snapshot's memory
	// and need no copy.
	slices.SortStableFunc(cs, func(a, b candidate) int {
		return cmp.Compare(boolInt(b.node.Name == f.c.cfg.Node), boolInt(a.node.Name == f.c.cfg.Node))
	})
	count, over := make([]int, len(cs)), make([]int, len(cs))
	mib := int64(cmpInt(int64(meta.MemoryMiB), 0))
	left := func(i int) int64 { return cs[i].free - int64(count[i]+over[i])*mib }
	for range n {
		best := 0
		for i := range cs {
			if left(i) > left(best) {
				best = i
			}
		}
		if left(best) >= mib {
			count[best]++
		} else {
			over[best]++
		}
	}
	for i, c := range cs {
		if count[i] > 0 {
			plan = append(plan, share{node: c.node, n: count[i]})
		}
		if over[i] > 0 {
			overflow = append(overflow, share{node: c.node, n: over[i]})
		}
	}
	return plan, overflow, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// importTimeout bounds a node's import of a share: the fetch of the image
// and the restores.
var importTimeout = 10 * time.Minute

// importOn asks node n to fetch the snapshot from this node and fork its
// share of children.
func importOn(ctx context.Context, token string, n api.Node, req importRequest) (api.ForkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return api.ForkResult{}, err
	}
	resp, err := internalCall(ctx, token, n, http.MethodPost, "/v1/internal/fork/import", bytes.NewReader(body))
	if err != nil {
		return api.ForkResult{}, err
	}
	defer resp.Body.Close()
	var res api.ForkResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&res); err != nil {
		return api.ForkResult{}, errdefs.New(errdefs.Unavailable, "node %s: its answer to the import does not parse: %v", n.Name, err)
	}
	return res, nil
}

// internalCall sends a request to node n's internal API with the cluster
// token; an answer that is not a 2xx is its error.
func internalCall(ctx context.Context, token string, n api.Node, method, path string, body io.Reader) (*http.Response, error) {
	host := n.Addr
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	r, err := http.NewRequestWithContext(ctx, method, host+path, body)
	if err != nil {
		return nil, errdefs.New(errdefs.Unavailable, "node %s's address %q: %v", n.Name, n.Addr, err)
	}
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Content-Type", "application/json")
	resp, err := internalClient.Do(r)
	if err != nil {
		return nil, noAnswer{errdefs.New(errdefs.Unavailable, "node %s does not answer: %v", n.Name, err)}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var ae api.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &ae) != nil || ae.Code == "" {
		return nil, errdefs.New(errdefs.Unavailable, "node %s answered %s: %.200q", n.Name, resp.Status, b)
	}
	return nil, errdefs.New(errdefs.Class(ae.Code), "%s", ae.Message)
}

var internalClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second,
	DialContext: deadpeer.NewDialer(5*time.Second, peerDeadTimeout).DialContext}}

// Internal serves the routes nodes call on each other, under
// /v1/internal/, with the cluster token only (on the unix socket too):
// POST fork/import (fork a share of children of another node's snapshot),
// GET snapshots/{digest} (stream a sealed image being sent) and GET
// roots/{id} (stream an image root this node holds, by its identity).
func (s *Service) Internal() http.Handler { return s.forks.handler() }

// handler is Internal.
func (f *forks) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/internal/fork/import", f.serveImport)
	mux.HandleFunc("GET /v1/internal/snapshots/{digest}", f.serveImage)
	mux.HandleFunc("GET /v1/internal/roots/{id}", f.serveRoot)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || f.c.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(f.c.cfg.Token)) != 1 {
			writeErr(w, errdefs.New(errdefs.Unauthenticated, "the internal routes take the cluster token only"))
			return
		}
		if f.porter == nil {
			writeErr(w, errdefs.New(errdefs.NotFound, "this node does not fork across nodes"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func writeErr(w http.ResponseWriter, err error) {
	c := errdefs.ClassOf(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errdefs.HTTPStatus(c))
	_ = json.NewEncoder(w).Encode(api.Error{Code: string(c), Message: err.Error()})
}

func (f *forks) serveImport(w http.ResponseWriter, r *http.Request) {
	var req importRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeErr(w, errdefs.New(errdefs.InvalidArgument, "malformed import request: %v", err))
		return
	}
	if req.Origin == "" || req.Origin == f.c.cfg.Node {
		writeErr(w, errdefs.New(errdefs.InvalidArgument, "an import names the node to fetch from (not this one)"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), importTimeout)
	defer cancel()
	origin, live, err := f.c.node(ctx, req.Origin)
	if err == nil && !live {
		err = errdefs.New(errdefs.Unavailable, "node %s, to fetch snapshot %s from, is not in the cluster", req.Origin, req.Snapshot.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	// The import goes on if the origin goes away (its children are then
	// settled), but its fetches from the origin keep the bound: one that
	// stops sending mid-stream held the root's fetch, the snapshot's lock
	// and the children's memory for ever.
	deadline, _ := ctx.Deadline()
	fetch := func(ctx context.Context, dir string) error {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return fetchImage(ctx, f.c.cfg.Token, origin, req.Snapshot.Digest, dir)
	}
	var from storeFetches
	fetchRoot := func(ctx context.Context, id string) (io.ReadCloser, error) {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		rc, err := fetchRoot(ctx, f.c.cfg.Token, origin, id)
		if err != nil {
			// The origin serves the snapshot, so it holds the root
			// unless it went away meanwhile: then the store's copy.
			var serr error
			if rc, serr = f.c.storeRoot(ctx, id); serr != nil {
				cancel()
				return nil, err
			}
			from.note(id)
		}
		return cancelOnClose{rc, cancel}, nil
	}
	reserve, settle := f.reserveImport(context.WithoutCancel(ctx), req)
	res, err := f.porter.Import(context.WithoutCancel(ctx), req.Snapshot, req.N, fetch, fetchRoot, reserve)
	if id := from.take(); err != nil && id != "" && errors.Is(err, image.ErrRootStream) {
		// The store's copy is bad: deleted (the next sleep or snapshot
		// on it where a node holds it puts it back).
		f.c.dropStoreRoot(context.WithoutCancel(ctx), id, err)
	}
	if err != nil {
		settle(res, err)
		writeErr(w, err)
		return
	}
	res = f.settleLocal(context.WithoutCancel(r.Context()), res)
	settle(res, nil)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// fetchImage copies the image with digest from node origin into dir (not
// existing yet): what origin sends is checked as it comes (the manifest
// against the digest, each file against its size) and then verified whole
// by the import; nothing is restored from it before.
func fetchImage(ctx context.Context, token string, origin api.Node, digest, dir string) error {
	resp, err := internalCall(ctx, token, origin, http.MethodGet, "/v1/internal/snapshots/"+digest, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return receiveImage(resp.Body, digest, dir)
}

func (f *forks) serveImage(w http.ResponseWriter, r *http.Request) {
	dir, release, err := f.porter.Open(r.PathValue("digest"))
	if err != nil {
		writeErr(w, err)
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	if err := sendImage(w, dir); err != nil {
		f.c.cfg.Log.Warn("cluster: send a snapshot image", "digest", r.PathValue("digest"), "err", err)
		panic(http.ErrAbortHandler) // the peer sees a cut stream, never a whole one
	}
}

// fetchRoot opens the root stream of the image root with identity id from
// node origin (image.ReceiveRoot checks it as it comes).
func fetchRoot(ctx context.Context, token string, origin api.Node, id string) (io.ReadCloser, error) {
	resp, err := internalCall(ctx, token, origin, http.MethodGet, "/v1/internal/roots/"+id, nil)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", origin.Name, err)
	}
	return resp.Body, nil
}

// cancelOnClose is a body whose request's context ends with Close.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (f *forks) serveRoot(w http.ResponseWriter, r *http.Request) {
	started := false
	err := f.porter.SendRoot(r.Context(), r.PathValue("id"), func() io.Writer {
		started = true
		w.Header().Set("Content-Type", "application/octet-stream")
		return w
	})
	switch {
	case err != nil && !started:
		writeErr(w, err)
	case err != nil:
		f.c.cfg.Log.Warn("cluster: send an image root", "root", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler) // the peer sees a cut stream, never a whole one
	}
}

// RemoveAbandoned removes what a fork made for a client that went away,
// on whichever node holds each.
func (s *Service) RemoveAbandoned(ctx context.Context, why string, ids ...string) {
	var mine []string
	for _, id := range ids {
		svc, err := s.route(ctx, id)
		if err != nil || svc == s.Service {
			mine = append(mine, id)
			continue
		}
		if err := svc.Remove(context.WithoutCancel(ctx), id); err != nil && !errdefs.IsNotFound(err) {
			s.c.cfg.Log.Warn("cluster: remove an abandoned sandbox", "sandbox", id, "why", why, "err", err)
		}
	}
	if len(mine) > 0 {
		s.Service.RemoveAbandoned(ctx, why, mine...)
	}
}

var _ service.Spreader = (*Service)(nil)

var errShortImage = errors.New("the image stream ended early")
