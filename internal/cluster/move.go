package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/snapstore"
)

// Moves of sleeping sandboxes (sleep and wake anywhere). A sleeping
// sandbox whose image has a sealed copy in the snapshot store has a
// record that names the copy's digest (Record.SleepImage); its node is
// then only where it wakes by default. A move has two steps, each one
// compare-and-swap on the record:
//
//  1. Reassign (any node): the record of a sandbox whose node is gone
//     (lease lapsed), refuses to wake it for room, or is drained, is
//     rewritten to name the node placement picks, still sleeping, at the
//     next epoch. The old node, should it come back, is fenced.
//  2. Adopt (the named node, on the first call on the sandbox it does not
//     have): the record becomes StateMoving, bound to the node's lease by
//     moves/ID; the node fetches the image by digest, verifies it,
//     recreates the local record from the image (service.Mover.Adopt) and
//     publishes it sleeping. The call then wakes it through the node's
//     normal wake path. A node killed mid-move leaves a claim whose
//     moves/ID lapses with its lease: the record is taken again (by the
//     restarted node's census, or by the next call through any node).
//
// Concurrent calls through different nodes: the reassign's CAS picks one
// target, the losers read the record again and forward to it; on the
// target the adopt's CAS lets one call move it, the others wait for the
// record to settle and wake it there under the sandbox's lock: exactly
// one move and one wake.

// StateMoving is the state of a record while its node adopts it.
const StateMoving = "moving"

func moveKey(id string) string { return keyPrefix + "moves/" + id }

// moveWait bounds how long a call waits for another node's (or call's)
// move of the sandbox to settle: a fetch of a large image takes a while.
const moveWait = 3 * time.Minute

// whyNotMovable says why a sleeping sandbox wakes only on its node.
const whyNotMovable = "its sleep image has no copy in the object store (its node has no --object-store, the copy was not finished, " +
	"it slept with --no-memory, or it mounts volumes or takes secrets, which are its node's own)"

// movable is whether rec may wake on a node other than its own.
func movable(rec Record) bool {
	return rec.State == "sleeping" && rec.SleepImage != ""
}

// lookupRev reads id's record with its revision, and whether a move's
// claim on it is alive.
func (c *Cluster) lookupRev(ctx context.Context, id string) (rec Record, rev int64, claimed, ok bool, err error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Txn(ctx).Then(clientv3.OpGet(sandboxKey(id)), clientv3.OpGet(moveKey(id), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return Record{}, 0, false, false, unavailable("look up "+id, err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Record{}, 0, false, false, nil
	}
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return Record{}, 0, false, false, fmt.Errorf("cluster: the record of %s does not parse: %w", id, err)
	}
	return rec, kvs[0].ModRevision, len(r.Responses[1].GetResponseRange().Kvs) > 0, true, nil
}

// errMoveRace is a reassign or claim that lost to another write.
var errMoveRace = errors.New("the record changed under the move")

// Reassign rewrites the record of sleeping sandbox id, read at rev, to
// name node to, at the next epoch. With gone, only while the record's
// node is absent from the cluster (a node that rejoined meanwhile keeps
// its sandbox).
func (c *Cluster) Reassign(ctx context.Context, rec Record, rev int64, to string, gone bool) (Record, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	sk := sandboxKey(rec.ID)
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sk), "=", rev)}
	if gone {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(nodeKey(rec.Node)), "=", 0))
	}
	from := rec.Node
	rec.Node, rec.Epoch, rec.UpdatedAt = to, rec.Epoch+1, time.Now().UTC()
	rec.Sandbox.Node = to
	b, err := json.Marshal(rec)
	if err != nil {
		return Record{}, err
	}
	r, err := c.cli.Txn(ctx).If(conds...).Then(clientv3.OpPut(sk, string(b))).Commit()
	if err != nil {
		return Record{}, unavailable("move the record of "+rec.ID, err)
	}
	if !r.Succeeded {
		return Record{}, errMoveRace
	}
	c.cfg.Log.Info("cluster: sleeping sandbox given to another node", "sandbox", rec.ID, "from", from, "to", to, "epoch", rec.Epoch)
	return rec, nil
}

// claim marks id's record, read at rev and naming this node (or a claim
// that lapsed), as being moved here, bound to this node's lease; it
// returns the record as it was and the claim's revision.
func (c *Cluster) claim(ctx context.Context, rec Record, rev int64) (int64, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	sk, mk := sandboxKey(rec.ID), moveKey(rec.ID)
	claimed := rec
	claimed.Node, claimed.State, claimed.UpdatedAt = c.cfg.Node, StateMoving, time.Now().UTC()
	claimed.Sandbox.Node, claimed.Sandbox.State = c.cfg.Node, StateMoving
	if rec.Node != c.cfg.Node {
		claimed.Epoch++
	}
	b, err := json.Marshal(claimed)
	if err != nil {
		return 0, err
	}
	r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", rev), clientv3.Compare(clientv3.CreateRevision(mk), "=", 0)).
		Then(clientv3.OpPut(sk, string(b)), clientv3.OpPut(mk, c.cfg.Node, clientv3.WithLease(lease))).Commit()
	if err != nil {
		return 0, unavailable("claim "+rec.ID, err)
	}
	if !r.Succeeded {
		return 0, errMoveRace
	}
	c.setEpoch(rec.ID, claimed.Epoch)
	return r.Header.Revision, nil
}

// unclaim puts back the record a failed adopt had claimed (at claimRev),
// sleeping on this node, and drops the claim.
func (c *Cluster) unclaim(ctx context.Context, rec Record, claimRev int64) error {
	ctx, cancel := c.opCtx(context.WithoutCancel(ctx))
	defer cancel()
	sk := sandboxKey(rec.ID)
	rec.Node, rec.State, rec.UpdatedAt = c.cfg.Node, "sleeping", time.Now().UTC()
	rec.Sandbox.Node, rec.Sandbox.State = c.cfg.Node, "sleeping"
	rec.Epoch = c.epoch(rec.ID)
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", claimRev)).
		Then(clientv3.OpPut(sk, string(b)), clientv3.OpDelete(moveKey(rec.ID))).Commit()
	if err != nil {
		return unavailable("give back "+rec.ID, err)
	}
	return nil
}

// holdWake clears the image of sleeping sandbox id's record, this
// node's, before the node wakes it: a wake --node elsewhere reassigns
// only a record that names its image. It reports false when the record
// names another node at an epoch this node did not write (given away
// since the call was routed): this node must not wake its copy.
func (c *Cluster) holdWake(ctx context.Context, id string) (bool, error) {
	for try := 0; ; try++ {
		rec, rev, claimed, ok, err := c.lookupRev(ctx, id)
		if err != nil || !ok {
			return true, err
		}
		if rec.Node != c.cfg.Node {
			return rec.Epoch <= 1 || rec.Epoch <= c.epoch(id), nil
		}
		if claimed || rec.State != "sleeping" || rec.SleepImage == "" {
			return true, nil
		}
		rec.SleepImage, rec.SleepKey, rec.UpdatedAt = "", "", time.Now().UTC()
		b, err := json.Marshal(rec)
		if err != nil {
			return true, err
		}
		sk := sandboxKey(id)
		r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", rev)).Then(clientv3.OpPut(sk, string(b))).Commit()
		if err != nil {
			return true, unavailable("hold the record of "+id, err)
		}
		if r.Succeeded || try == 4 {
			return true, nil
		}
	}
}

// dropClaim removes a settled move's claim.
func (c *Cluster) dropClaim(ctx context.Context, id string) {
	ctx, cancel := c.opCtx(context.WithoutCancel(ctx))
	defer cancel()
	_, _ = c.cli.Delete(ctx, moveKey(id))
}

// moves is the part of Service that moves sleeping sandboxes between
// nodes: it owns the sandboxes whose image's copy is awaited, the
// adoptions under way in this process and their count. It takes the
// cluster, the node's own service and the creates in flight (placement),
// and calls back into the Service through moveOps.
type moves struct {
	c       *Cluster
	local   service.Service
	pending *pending
	svc     moveOps

	// placeMu makes a move's pick and its count in pending one step:
	// the drain's moves run together.
	placeMu sync.Mutex
	await   awaiting // sleeping sandboxes whose copy is not sealed yet
	moving  sync.Map // ids this process is adopting
	waking  sync.Map // ids this node wakes now: their records name no image (holdWake)
	// imgMu makes reading a sandbox's image and writing the record that
	// names it one step against holdWake (by id, striped): a write whose
	// image was read before its wake began lands before the hold.
	imgMu [32]sync.Mutex
	n     atomic.Int64 // sandboxes adopted
}

// moveOps is what a move calls back into the node's Service for: a
// record written (fenced: the sandbox disowned), a call routed, a cached
// route dropped.
type moveOps interface {
	publish(ctx context.Context, sb api.Sandbox) error
	route(ctx context.Context, ref string) (service.Service, error)
	forgetRoute(id string)
	Wake(ctx context.Context, ref string) (api.Sandbox, error)
}

// mover is the local service's Mover, nil when it has none.
func (mv *moves) mover() service.Mover {
	m, _ := mv.local.(service.Mover)
	return m
}

// sleepImage is the digest of sleeping sb's image in the snapshot store,
// "" when there is none (yet: the node then publishes the record again
// once the copy is sealed, see republishCopied).
func (mv *moves) sleepImage(ctx context.Context, sb api.Sandbox) string {
	m := mv.mover()
	if m == nil || sb.State != "sleeping" {
		return ""
	}
	if _, ok := mv.waking.Load(sb.ID); ok {
		return "" // the wake writes the record next
	}
	d, err := m.SleepImage(ctx, sb.ID)
	if err != nil {
		if errdefs.IsNotFound(err) {
			mv.awaitCopy(sb.ID)
		}
		return ""
	}
	return d
}

// copyWait is how long a sleeping sandbox's record is published again
// every second while its image's copy is not sealed: a node without a
// snapshot store gives up after it.
const copyWait = 10 * time.Minute

type awaiting struct {
	mu  sync.Mutex
	ids map[string]time.Time // guarded by mu: since when
}

// lockImage locks imgMu's stripe of sandbox id.
func (mv *moves) lockImage(id string) func() {
	h := fnv.New32a()
	h.Write([]byte(id))
	mu := &mv.imgMu[h.Sum32()%uint32(len(mv.imgMu))]
	mu.Lock()
	return mu.Unlock
}

func (mv *moves) awaitCopy(id string) {
	mv.await.mu.Lock()
	defer mv.await.mu.Unlock()
	if mv.await.ids == nil {
		mv.await.ids = map[string]time.Time{}
	}
	if _, ok := mv.await.ids[id]; !ok {
		mv.await.ids[id] = time.Now()
	}
}

// republishCopied publishes again the records of sleeping sandboxes whose
// image's copy was not sealed at their last write: the record names the
// digest from then on.
func (mv *moves) republishCopied(ctx context.Context) {
	mv.await.mu.Lock()
	var ids []string
	for id, since := range mv.await.ids {
		if time.Since(since) > copyWait {
			delete(mv.await.ids, id)
			continue
		}
		ids = append(ids, id)
	}
	mv.await.mu.Unlock()
	m := mv.mover()
	for _, id := range ids {
		sb, err := mv.local.Get(ctx, id)
		done := err != nil || sb.State != "sleeping" || m == nil
		if !done {
			d, derr := m.SleepImage(ctx, id)
			done = derr == nil || !errdefs.IsNotFound(derr)
			if d != "" {
				unlock := mv.lockImage(id)
				// The sandbox and its image as they are after the
				// record's read: a wake between this pass's reads and
				// its write must not be overwritten with the image it
				// woke from.
				err := mv.c.PublishCopied(ctx, id, func(ctx context.Context) (api.Sandbox, string, error) {
					sb, err := mv.local.Get(ctx, id)
					if err != nil || sb.State != "sleeping" {
						return sb, "", nil
					}
					return sb, mv.sleepImage(ctx, sb), nil
				})
				unlock()
				if err != nil {
					mv.c.cfg.Log.Warn("cluster: write a sleeping sandbox's record with its image", "sandbox", id, "err", err)
					done = false
				}
			}
		}
		if done {
			mv.await.mu.Lock()
			delete(mv.await.ids, id)
			mv.await.mu.Unlock()
		}
	}
}

// disown removes this node's copy of a sandbox the cluster gave another
// node (or declared lost), keeping its copy in the snapshot store.
func (mv *moves) disown(ctx context.Context, id string) error {
	ctx = context.WithoutCancel(ctx)
	if m := mv.mover(); m != nil {
		return m.Disown(ctx, id)
	}
	return mv.local.Remove(ctx, id)
}

// movedAway reports whether the cluster gave sandbox id, which this node
// has asleep, to another node (its record names another node at a higher
// epoch than this node knows), and then removes this node's copy: a
// node must not wake what it no longer holds. etcd out of reach: not
// moved (the node serves its own).
func (mv *moves) movedAway(ctx context.Context, id string) bool {
	// Bounded short: etcd out of reach must not hold a node's calls on
	// its own sandboxes long.
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rec, ok, err := mv.c.Lookup(lctx, id)
	if err != nil || !ok || rec.State == StateLost || rec.Epoch <= 1 || rec.Epoch <= mv.c.epoch(id) {
		return false
	}
	if rec.Node == mv.c.cfg.Node {
		if rec.SleepImage == "" || rec.State != "sleeping" && rec.State != StateMoving || givenBack(lctx, mv, rec) {
			return false
		}
		// Given back after another node woke and slept it: this copy
		// is stale; dropped, the record's image is adopted.
	}
	mv.c.cfg.Log.Warn("cluster: fenced: a sleeping sandbox moved to another node; removing this node's copy", "sandbox", id, "node", rec.Node, "epoch", rec.Epoch)
	if err := mv.disown(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		mv.c.cfg.Log.Warn("cluster: remove a moved sandbox's copy", "sandbox", id, "err", err)
	}
	return true
}

// givenBack reports whether rec, which the cluster gave (back) to this
// node at an epoch the node did not write, names the sleep image this
// node holds (given away and back before another node adopted it): the
// copy here is then the sandbox, and this node's again at rec's epoch.
// Another image means another node woke and slept it meanwhile: the copy
// here is stale.
func givenBack(ctx context.Context, mv *moves, rec Record) bool {
	m := mv.mover()
	if m == nil || rec.Node != mv.c.cfg.Node || rec.SleepImage == "" {
		return false
	}
	d, err := m.SleepImage(ctx, rec.ID)
	if err != nil || d != rec.SleepImage {
		return false
	}
	mv.c.setEpoch(rec.ID, rec.Epoch)
	return true
}

// routeSleeping routes a call on a sandbox this node does not have, by its
// record: a sleeping one whose node is gone is given to the node
// placement picks, one given to this node is adopted here, one being
// moved is waited for. ok false: the caller routes rec as ever.
func (mv *moves) routeSleeping(ctx context.Context, ref string, rec Record) (svc service.Service, ok bool, err error) {
	deadline := time.Now().Add(moveWait)
	for try := 0; ; try++ {
		if try > 0 {
			if time.Now().After(deadline) {
				return nil, true, errdefs.New(errdefs.Unavailable, "sandbox %s is being moved to node %s and the move has not settled in %s: try again", rec.ID, rec.Node, moveWait)
			}
			select {
			case <-ctx.Done():
				return nil, true, ctx.Err()
			case <-time.After(200 * time.Millisecond): // polling another node's move of the record
			}
		}
		cur, rev, claimed, found, err := mv.c.lookupRev(ctx, rec.ID)
		if err != nil {
			return nil, true, err
		}
		if !found {
			return nil, false, nil
		}
		rec = cur
		switch {
		case rec.State == StateMoving && claimed:
			continue // a move under way: wait for it
		case rec.State == StateMoving:
			// A claim that lapsed with its node: sleeping again, on the
			// node that claimed it (taken again below).
			rec.State = "sleeping"
		case !movable(rec):
			return nil, false, nil
		}
		if rec.Node == mv.c.cfg.Node {
			if _, err := mv.local.Get(ctx, rec.ID); err == nil {
				return mv.local, true, nil // adopted meanwhile (another call's move)
			}
			if !opens(api.Node{Capacity: api.NodeCapacity{StoreKey: mv.c.cfg.StoreKey}}, rec) {
				// Given here by a node that could not tell (or before
				// this node's key changed): this node cannot open the
				// image, so it claims nothing and gives the record on.
				why := fmt.Sprintf("sandbox %s was given to node %s, which cannot open its sleep image: it is %s in the object store, and this node has %s; "+
					"every node must have --encrypt-at-rest and the same host key (--key-file or $CLADE_KEY) to wake another node's image",
					rec.ID, mv.c.cfg.Node, imageKeyWords(rec.SleepKey), keyWords(mv.c.cfg.StoreKey))
				mv.c.cfg.Log.Warn("cluster: "+why+": giving it to another node", "sandbox", rec.ID)
				if gerr := mv.giveOn(ctx, rec.ID); gerr != nil {
					return nil, true, errdefs.New(errdefs.Unavailable, "%s; no other node takes it now (%v): it stays asleep, try again later", why, gerr)
				}
				continue
			}
			svc, err := mv.adoptHere(ctx, rec, rev)
			if errors.Is(err, errMoveRace) {
				continue
			}
			if errdefs.Is(err, errdefs.ResourceExhausted) {
				// This node cannot take it (larger than its --max-memory
				// or --max-cpus): the record, sleeping here again, goes to
				// another node.
				mv.c.cfg.Log.Info("cluster: this node cannot take a sandbox given to it: giving it to another node", "sandbox", rec.ID, "err", err)
				if gerr := mv.giveOn(ctx, rec.ID); gerr != nil {
					return nil, true, errdefs.New(errdefs.Unavailable, "%v; no other node takes it now (%v): it stays asleep, try again later", err, gerr)
				}
				continue
			}
			return svc, true, err
		}
		_, live, err := mv.c.node(ctx, rec.Node)
		if err != nil {
			return nil, true, err
		}
		if live {
			return nil, false, nil // its node wakes it (or adopts it)
		}
		if _, err := mv.reassign(ctx, rec, rev, true, ""); err != nil && !errors.Is(err, errMoveRace) {
			return nil, true, err
		}
		// Given to a node (or another call's node won): route again.
	}
}

// giveOn gives sleeping sandbox id, whose record names this node, to
// another node (this one refused to adopt it).
func (mv *moves) giveOn(ctx context.Context, id string) error {
	rec, rev, claimed, ok, err := mv.c.lookupRev(ctx, id)
	switch {
	case err != nil:
		return err
	case !ok || claimed || rec.Node != mv.c.cfg.Node || !movable(rec):
		return nil // changed meanwhile: routed again as it is now
	}
	_, err = mv.reassign(ctx, rec, rev, false, "")
	if errors.Is(err, errMoveRace) {
		return nil
	}
	return err
}

// reassign gives sleeping rec (read at rev) to the node placement picks
// among the live nodes other than its own and except.
func (mv *moves) reassign(ctx context.Context, rec Record, rev int64, gone bool, except string) (Record, error) {
	nodes, err := mv.c.Nodes(ctx)
	if err != nil {
		return Record{}, err
	}
	cs := mv.candidates(nodes, rec, except)
	if len(cs) == 0 {
		return Record{}, noCandidate(nodes, rec, except)
	}
	return mv.c.Reassign(ctx, rec, rev, cs[0].node.Name, gone)
}

// noCandidate is the error of a sleeping rec that no live node but its
// own (and except) may be given.
func noCandidate(nodes []api.Node, rec Record, except string) error {
	if other := otherKeys(nodes, rec, except); len(other) > 0 {
		return errdefs.New(errdefs.Unavailable, "sandbox %s sleeps on node %s, which cannot wake it, and the other live nodes that take sandboxes cannot open its sleep image: "+
			"it is %s in the object store, and %s; every node must have --encrypt-at-rest and the same host key (--key-file or $CLADE_KEY) to wake another node's image. "+
			"It stays asleep: it wakes when node %s is back, or on a node with its key",
			rec.ID, rec.Node, imageKeyWords(rec.SleepKey), strings.Join(other, ", "), rec.Node)
	}
	return errdefs.New(errdefs.Unavailable, "sandbox %s sleeps on node %s, which cannot wake it, and no other live node that is not draining runs its engine, has its image and takes its size (%d MiB, %g CPUs): try again later",
		rec.ID, rec.Node, rec.Sandbox.MemoryMiB, rec.Sandbox.CPUs)
}

// give gives sleeping rec (read at rev) to the node placement picks, as
// reassign does. With wake (a drain wakes it there at once) only a node
// with room for it now takes it, and its memory counts on that node (as
// a create's does, placement's pending) until done says how the wake
// ended: moves that run together do not all pick the node that looked
// freest, nor two of them a node with room for one.
func (mv *moves) give(ctx context.Context, rec Record, rev int64, wake bool) (Record, func(ok bool), error) {
	nodes, err := mv.c.Nodes(ctx)
	if err != nil {
		return Record{}, nil, err
	}
	n, done, err := mv.reserve(nodes, rec, wake)
	if err != nil {
		return Record{}, nil, err
	}
	to, err := mv.c.Reassign(ctx, rec, rev, n.Name, false)
	if err != nil {
		done(false)
		return Record{}, nil, err
	}
	return to, done, nil
}

// reserve picks the node for rec among nodes (see give): with room, the
// node's room is taken for it until done.
func (mv *moves) reserve(nodes []api.Node, rec Record, room bool) (api.Node, func(ok bool), error) {
	mv.placeMu.Lock()
	defer mv.placeMu.Unlock()
	cs := mv.candidates(nodes, rec, "")
	if len(cs) == 0 {
		return api.Node{}, nil, noCandidate(nodes, rec, "")
	}
	if !room {
		return cs[0].node, func(bool) {}, nil
	}
	if cs[0].free < 0 {
		return api.Node{}, nil, errNoRoom{roomWords(cs)}
	}
	n := cs[0].node
	done := mv.pending.add(n.Name, rec.ID, cmpInt(int64(rec.Sandbox.MemoryMiB), n.Capacity.DefaultMemoryMiB))
	return n, func(ok bool) { done(ok) }, nil
}

// noRoom says why no node other than its own has room now for running
// sandbox rec ("" when one has, counting the moves under way).
func (mv *moves) noRoom(nodes []api.Node, rec Record) string {
	mv.placeMu.Lock()
	defer mv.placeMu.Unlock()
	cs := mv.candidates(nodes, rec, "")
	if len(cs) == 0 || cs[0].free >= 0 {
		return ""
	}
	return roomWords(cs)
}

// roomOn is the node that has room now for running sandbox rec (its
// pick), counting the moves under way; "" when none has.
func (mv *moves) roomOn(nodes []api.Node, rec Record) string {
	mv.placeMu.Lock()
	defer mv.placeMu.Unlock()
	cs := mv.candidates(nodes, rec, "")
	if len(cs) == 0 || cs[0].free < 0 {
		return ""
	}
	return cs[0].node.Name
}

// errNoRoom is a move that waits for room: no node it may go to has the
// memory for it now.
type errNoRoom struct{ why string }

func (e errNoRoom) Error() string { return e.why }

// roomWords says that none of cs has room now.
func roomWords(cs []candidate) string {
	var each []string
	for _, c := range cs {
		each = append(each, fmt.Sprintf("node %s would be %d MiB short", c.node.Name, -c.free))
	}
	return "no other node has memory for it now (" + strings.Join(each, ", ") + "): it moves once one has"
}

// candidates ranks the nodes rec may be given to: live, not its own nor
// except, and taking its size (--max-memory, --max-cpus), by placement's
// rules.
func (mv *moves) candidates(nodes []api.Node, rec Record, except string) []candidate {
	var others []api.Node
	for _, n := range nodes {
		c := n.Capacity
		if n.Name == rec.Node || n.Name == except || !opens(n, rec) ||
			c.MaxMemoryMiB > 0 && int64(rec.Sandbox.MemoryMiB) > c.MaxMemoryMiB || c.MaxCPUs > 0 && rec.Sandbox.CPUs > c.MaxCPUs {
			continue
		}
		others = append(others, n)
	}
	req := api.CreateSandboxRequest{Image: rec.Sandbox.Image, MemoryMiB: rec.Sandbox.MemoryMiB, Engine: rec.Sandbox.Engine}
	// Nodes without the image come after those with it: the adopter
	// fetches the root from a node that holds it.
	return rankAnywhere(others, req, mv.pending.of, defaultRand)
}

// opens is whether node n can open rec's sleep image: its object store
// key is the one the image was sealed under (a record an older node wrote
// does not say: any node may try).
func opens(n api.Node, rec Record) bool {
	return rec.SleepKey == "" || n.Capacity.StoreKey == rec.SleepKey
}

// otherKeys describes the live nodes (but rec's own and except) that
// cannot open rec's image for their key.
func otherKeys(nodes []api.Node, rec Record, except string) []string {
	var out []string
	for _, n := range nodes {
		if n.Name != rec.Node && n.Name != except && !opens(n, rec) {
			out = append(out, fmt.Sprintf("node %s has %s", n.Name, keyWords(n.Capacity.StoreKey)))
		}
	}
	return out
}

// keyWords says what a node's store key is, for messages.
func keyWords(k string) string {
	switch k {
	case "":
		return "no --object-store"
	case "plain":
		return "no --encrypt-at-rest (its store key is plain)"
	}
	return "host key " + k
}

// imageKeyWords says how an image of store key k is kept, for messages.
func imageKeyWords(k string) string {
	if k == "plain" {
		return "in plaintext (its node has no --encrypt-at-rest)"
	}
	return "sealed under host key " + k
}

// adoptHere moves sleeping rec (read at rev), which names this node but
// this node does not have, here: claimed, fetched and recreated asleep.
func (mv *moves) adoptHere(ctx context.Context, rec Record, rev int64) (service.Service, error) {
	m := mv.mover()
	if m == nil {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s was given to this node, which cannot adopt sandboxes", rec.ID)
	}
	mv.moving.Store(rec.ID, true)
	defer mv.moving.Delete(rec.ID)
	claimRev, err := mv.c.claim(ctx, rec, rev)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	// Bounded: a hung object store (or a root's source) must not leave
	// the sandbox moving (and its callers waiting) for long.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mv.c.cfg.MoveTimeout)
	var from storeFetches
	fetch := func(ctx context.Context, id string) (io.ReadCloser, error) {
		return mv.fetchRootAnywhere(ctx, id, &from)
	}
	sb, err := m.Adopt(actx, rec.ID, rec.SleepImage, fetch)
	if err != nil && errors.Is(err, image.ErrRootStream) && actx.Err() == nil {
		if id := from.take(); id != "" {
			// The store's copy of the root is bad: deleted, so that the
			// next sleep on it (where a node holds it) puts it back.
			// Asked again: a live node may hold the root now (one back,
			// or one that failed to answer).
			mv.c.dropStoreRoot(actx, id, err)
			first := err
			if sb, err = m.Adopt(actx, rec.ID, rec.SleepImage, fetch); err != nil {
				err = fmt.Errorf("%w (the object store's copy of the root was deleted; asked again: %v)", first, err)
			}
		}
	}
	timedOut := actx.Err() != nil
	cancel()
	if err != nil {
		if uerr := mv.c.unclaim(ctx, rec, claimRev); uerr != nil {
			mv.c.cfg.Log.Warn("cluster: give back a failed move's claim (it lapses with the lease)", "sandbox", rec.ID, "err", uerr)
		}
		if timedOut {
			mv.c.cfg.Log.Warn("cluster: a move's fetch from the object store timed out; the sandbox stays asleep", "sandbox", rec.ID, "timeout", mv.c.cfg.MoveTimeout, "err", err)
			return nil, errdefs.New(errdefs.Unavailable, "sandbox %s: its sleep image did not come from the object store within %s (--cluster-move-timeout), so its move to node %s was given up; it stays asleep: try again",
				rec.ID, mv.c.cfg.MoveTimeout, mv.c.cfg.Node)
		}
		if errors.Is(err, image.ErrRootStream) {
			// A root a node or the store sent that does not verify: not
			// the caller's fault; the sandbox stays asleep.
			return nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("cluster: move sandbox %s here: %w (it stays asleep)", rec.ID, err))
		}
		return nil, fmt.Errorf("cluster: move sandbox %s here: %w", rec.ID, err)
	}
	if err := mv.svc.publish(ctx, sb); err != nil {
		mv.c.cfg.Log.Warn("cluster: write a moved sandbox's record", "sandbox", rec.ID, "err", err)
	}
	mv.c.dropClaim(ctx, rec.ID)
	mv.n.Add(1)
	mv.c.cfg.Log.Info("cluster: sleeping sandbox moved here", "sandbox", rec.ID, "digest", rec.SleepImage, "took", time.Since(t0).Round(time.Millisecond))
	return mv.local, nil
}

// fetchRootAnywhere opens the root stream of image root id from the first
// live node that holds it (its old node may be dead), else from the object
// store (the sleeping node copied it there beside the sleep image; noted
// in from): Unavailable, naming what each said, if none does. Live nodes
// first: they are nearer, and cost no egress.
func (mv *moves) fetchRootAnywhere(ctx context.Context, id string, from *storeFetches) (io.ReadCloser, error) {
	nodes, err := mv.c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var said []string
	for _, n := range nodes {
		if n.Name == mv.c.cfg.Node {
			continue
		}
		rc, err := fetchRoot(ctx, mv.c.cfg.Token, n, id)
		if err == nil {
			return rc, nil
		}
		said = append(said, err.Error())
	}
	if rc, err := mv.c.storeRoot(ctx, id); err == nil {
		from.note(id)
		return rc, nil
	} else if mv.c.cfg.StoreRoot != nil {
		said = append(said, "the object store: "+err.Error())
	}
	return nil, errdefs.New(errdefs.Unavailable, "no live node holds image root %.19s (%s): try again when its node is back", id, strings.Join(said, "; "))
}

// storeRoot opens image root id from the object store (NotFound without
// one), logging where the root came from.
func (c *Cluster) storeRoot(ctx context.Context, id string) (io.ReadCloser, error) {
	if c.cfg.StoreRoot == nil {
		return nil, errdefs.New(errdefs.NotFound, "this node has no object store")
	}
	// The stream is checked against the sum the cluster recorded when
	// it was uploaded, not against one read from the same object.
	want, err := c.RootSum(ctx, id)
	if err != nil {
		return nil, err
	}
	if want == nil {
		return nil, errdefs.New(errdefs.NotFound, "the object store's copy of image root %.19s has no digest recorded in the cluster (uploaded by a node that records none), so it is not used", id)
	}
	rc, err := c.cfg.StoreRoot(ctx, id)
	if errors.Is(err, snapstore.ErrBadRoot) {
		// An object that does not open at all (its header damaged):
		// deleted, as one whose bytes are refused.
		c.dropStoreRoot(ctx, id, err)
	}
	if err != nil {
		return nil, err
	}
	c.cfg.Log.Info("cluster: image root fetched from the object store", "root", id)
	return newSumReader(rc, want), nil
}

// dropStoreRoot deletes the object store's copy of root id, read from it
// and refused (why).
//
// Only a copy shown bad is deleted: one whose bytes, read again whole, do
// not hash to the sum the cluster recorded at its upload (or that does not
// open at all). A refusal is not that proof: a read of the store that
// failed midway (a reset connection) or this node's own limits refuse a
// good copy as a bad stream too, and the store's copy may be the only one
// left of a root whose node is gone. The look and the delete are made
// under the root's lock (LockRoot), which every upload of the root holds
// across its upload and its sum's record: a good upload cannot land
// between them.
func (c *Cluster) dropStoreRoot(ctx context.Context, id string, why error) {
	if c.cfg.StoreRootBad == nil {
		return
	}
	// Bounded: an upload of the root holds the lock for as long as it
	// sends (minutes, for a big root), and a wake or a fork is waiting on
	// this (that upload replaces the object anyway).
	lctx, cancel := context.WithTimeout(ctx, dropLockWait)
	lk, err := c.LockRoot(lctx, id, nil)
	cancel()
	if err != nil {
		c.cfg.Log.Warn("cluster: an image root from the object store was refused, but its copy there could not be locked to look again: kept", "root", id, "why", why, "err", err)
		return
	}
	defer lk.Unlock()
	bad, err := c.storeRootDiffers(ctx, id)
	if err != nil || !bad {
		c.cfg.Log.Warn("cluster: an image root from the object store was refused, but its copy there is not shown bad: kept", "root", id, "why", why, "recheck", err)
		return
	}
	c.hook("store-root-shown-bad")
	c.cfg.Log.Warn("cluster: the object store's copy of an image root did not verify: deleting it", "root", id, "why", why)
	c.cfg.StoreRootBad(ctx, id, why)
	// The recorded sum stays: it is still that of the root's last good
	// upload (a copy of it put back verifies), and the next upload, which
	// finds the root absent, replaces it.
}

// dropLockWait bounds how long a delete of a bad root waits for the
// root's lock.
const dropLockWait = time.Minute

// storeRootDiffers reads the object store's copy of root id whole and
// says whether its SHA-256 is not the one recorded, or it does not open
// at all (snapstore.ErrBadRoot); an error if that cannot be told.
func (c *Cluster) storeRootDiffers(ctx context.Context, id string) (bool, error) {
	want, err := c.RootSum(ctx, id)
	if err != nil {
		return false, err
	}
	if want == nil {
		return false, errdefs.New(errdefs.NotFound, "no digest of image root %.19s is recorded", id)
	}
	if c.cfg.StoreRoot == nil {
		return false, errdefs.New(errdefs.NotFound, "this node has no object store")
	}
	rc, err := c.cfg.StoreRoot(ctx, id)
	if errors.Is(err, snapstore.ErrBadRoot) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return false, err
	}
	return !bytes.Equal(h.Sum(nil), want), nil
}

// storeFetches is the image root a call's fetches last took from the
// object store: when the call refuses a root stream, whether it was the
// store's.
type storeFetches struct {
	mu sync.Mutex
	id string
}

func (f *storeFetches) note(id string) {
	f.mu.Lock()
	f.id = id
	f.mu.Unlock()
}

// take returns the root noted and forgets it.
func (f *storeFetches) take() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.id
	f.id = ""
	return id
}

// Moves is how many sleeping sandboxes this node adopted since it started.
func (s *Service) Moves() int64 { return s.moves.n.Load() }

// keepUnheld is whether resync keeps the record of a sandbox that names
// this node but that the node does not have: a sleeping one in the
// snapshot store (given to this node: adopted on the next call), or a
// move a killed daemon left (its claim lapsed with the old lease): that
// one is put back to sleeping on this node, the restart's census.
func (mv *moves) keepUnheld(ctx context.Context, r Record) bool {
	if r.SleepImage == "" || r.State != "sleeping" && r.State != StateMoving {
		return false
	}
	if _, busy := mv.moving.Load(r.ID); busy || r.State == "sleeping" {
		return true
	}
	rec, rev, claimed, ok, err := mv.c.lookupRev(ctx, r.ID)
	if err != nil || !ok || claimed || rec.State != StateMoving || rec.Node != mv.c.cfg.Node {
		return true // a live claim, or changed meanwhile: not this pass's
	}
	if _, busy := mv.moving.Load(r.ID); busy {
		return true
	}
	rec.State, rec.Sandbox.State, rec.UpdatedAt = "sleeping", "sleeping", time.Now().UTC()
	b, err := json.Marshal(rec)
	if err != nil {
		return true
	}
	cctx, cancel := mv.c.opCtx(ctx)
	defer cancel()
	t, err := mv.c.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(sandboxKey(r.ID)), "=", rev),
		clientv3.Compare(clientv3.CreateRevision(moveKey(r.ID)), "=", 0)).
		Then(clientv3.OpPut(sandboxKey(r.ID), string(b))).Commit()
	if err == nil && t.Succeeded {
		mv.c.cfg.Log.Info("cluster: a move a killed daemon left is undone: the sandbox sleeps in the snapshot store", "sandbox", r.ID)
	}
	return true
}

// roomRefused is whether err is a node's refusal to wake for memory.
func roomRefused(err error) bool {
	return errdefs.IsUnavailable(err) && strings.Contains(err.Error(), "memory")
}

// wakeElsewhere gives ref, which its live node refused to wake for room,
// to another node when it sleeps in the snapshot store, and returns that
// node's service; ok false leaves the refusal as the answer.
func (mv *moves) wakeElsewhere(ctx context.Context, ref string, refused error) (service.Service, bool) {
	if !roomRefused(refused) {
		return nil, false
	}
	rec, ok, err := mv.c.Lookup(ctx, ref)
	if err != nil || !ok {
		return nil, false
	}
	cur, rev, claimed, found, err := mv.c.lookupRev(ctx, rec.ID)
	if err != nil || !found || claimed || !movable(cur) {
		return nil, false
	}
	if _, err := mv.reassign(ctx, cur, rev, false, ""); err != nil {
		mv.c.cfg.Log.Info("cluster: a node refused a wake for room; no other node takes it", "sandbox", rec.ID, "err", err)
		return nil, false
	}
	mv.svc.forgetRoute(rec.ID)
	svc, err := mv.svc.route(ctx, rec.ID)
	return svc, err == nil
}

// drainSleeping gives the sleeping sandboxes of drained node whose image
// is in the snapshot store to the nodes placement picks (lazily: each is
// adopted where it is given on its next call). The drained node's copy is
// fenced: removed at its next check. Sandboxes that cannot move (no copy,
// volumes, secrets) stay. It returns how many were given away.
func (mv *moves) drainSleeping(ctx context.Context, node string) (int, error) {
	recs, err := mv.c.Records(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, r := range recs {
		if r.Node != node || !movable(r) {
			continue
		}
		rec, rev, claimed, ok, err := mv.c.lookupRev(ctx, r.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok || claimed || rec.Node != node || !movable(rec) {
			continue // changed meanwhile
		}
		if _, err := mv.reassign(ctx, rec, rev, false, ""); err != nil {
			if !errors.Is(err, errMoveRace) {
				errs = append(errs, fmt.Errorf("sandbox %s: %w", rec.ID, err))
			}
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
