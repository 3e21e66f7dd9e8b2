package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// StateImporting is the state of a fork's child on the node that imports
// it (fork.go): its id is picked and its record written before the node
// fetches the snapshot (and its image root), so that the cluster's list
// shows the children of a fork across nodes while they are fetched. The
// node's own record of the child (running) replaces it once the child is
// restored; a child that fails has its record removed; a node that dies
// mid-import has its importing records removed by the census (MarkLost),
// and one restarted drops them in its first full pass.
const StateImporting = "importing"

// imports are the ids of this node's children being imported: their
// importing records are not this node's sandboxes yet, and the full pass
// keeps them.
type imports struct {
	mu  sync.Mutex
	ids map[string]bool // guarded by mu
}

func (im *imports) add(ids []string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.ids == nil {
		im.ids = map[string]bool{}
	}
	for _, id := range ids {
		im.ids[id] = true
	}
}

func (im *imports) done(ids []string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	for _, id := range ids {
		delete(im.ids, id)
	}
}

func (im *imports) has(id string) bool {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.ids[id]
}

// importHoldEnv, set by tests only, names a file: while it exists, an
// import waits after writing its children's importing records (the
// import held, to look at the cluster meanwhile).
const importHoldEnv = "CLADE_TEST_IMPORT_HOLD"

// holdImport waits while the file importHoldEnv names exists (at most
// the import's bound).
func holdImport(ctx context.Context) {
	path := os.Getenv(importHoldEnv)
	if path == "" {
		return
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := os.Stat(path); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C: // polling the test's file
		}
	}
}

// PublishImporting writes the importing records of a fork's children
// that this node is about to import, in one transaction (each key must
// be new: an id is never reused).
func (c *Cluster) PublishImporting(ctx context.Context, ids []string, meta api.SnapshotExport) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	now := time.Now().UTC()
	var conds []clientv3.Cmp
	var then []clientv3.Op
	for _, id := range ids {
		sb := api.Sandbox{ID: id, Image: meta.Image, State: StateImporting, MemoryMiB: meta.MemoryMiB, CPUs: meta.CPUs,
			Engine: meta.Engine, CreatedAt: now}
		rec := Record{ID: id, Node: c.cfg.Node, State: StateImporting, Epoch: 1, UpdatedAt: now, Sandbox: summary(sb, c.cfg.Node)}
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		k := sandboxKey(id)
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
		then = append(then, clientv3.OpPut(k, string(b)))
	}
	r, err := c.cli.Txn(ctx).If(conds...).Then(then...).Commit()
	if err != nil {
		return unavailable("write the records of the fork's children", err)
	}
	if !r.Succeeded {
		return errdefs.New(errdefs.Unavailable, "the records of the fork's children: an id is taken in the directory")
	}
	return nil
}

// reserveImport is an import's reserve (sandbox.Porter.ImportAs): the
// children's importing records, written before the fetch.
func (f *forks) reserveImport(ctx context.Context, req importRequest) (reserve func(ids []string) error, settle func(res api.ForkResult, err error)) {
	var reserved []string
	reserve = func(ids []string) error {
		f.importing.add(ids)
		if err := f.c.PublishImporting(ctx, ids, req.Snapshot); err != nil {
			f.importing.done(ids)
			return err
		}
		reserved = ids
		holdImport(ctx)
		return nil
	}
	// settle removes the records of the children that were not made
	// (those made are written by settleLocal first).
	settle = func(res api.ForkResult, err error) {
		if reserved == nil {
			return
		}
		made := map[string]bool{}
		if err == nil {
			for _, ch := range res.Children {
				if ch.ID != "" && ch.Error == "" {
					made[ch.ID] = true
				}
			}
		}
		var errs []error
		for _, id := range reserved {
			if !made[id] {
				errs = append(errs, f.c.Unpublish(context.WithoutCancel(ctx), id, false))
			}
		}
		f.importing.done(reserved)
		if err := errors.Join(errs...); err != nil {
			f.c.cfg.Log.Warn("cluster: remove the records of fork children not made", "err", err)
		}
	}
	return reserve, settle
}

// importWait bounds how long a call on a fork's child waits for its
// node's import: the import's own bound (the node gives up on it then,
// and its record goes).
var importWait = importTimeout + time.Minute

// watchChange watches key for a change after revision rev, for at most
// bound: whether one came (false also when the watch broke, e.g. no
// leader for a moment).
func (c *Cluster) watchChange(ctx context.Context, key string, rev int64, bound time.Duration) bool {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for resp := range c.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1)) {
		if resp.Err() != nil || len(resp.Events) > 0 {
			return len(resp.Events) > 0
		}
	}
	return false
}

// awaitSleepImage waits, at most bound, until sandbox id's record names
// its sleep image's copy in the object store (its node writes it again as
// soon as the copy is sealed), or changes otherwise.
func (c *Cluster) awaitSleepImage(ctx context.Context, id string, bound time.Duration) {
	gctx, cancel := c.opCtx(ctx)
	g, err := c.cli.Get(gctx, sandboxKey(id))
	cancel()
	if err != nil {
		return
	}
	var rec Record
	if len(g.Kvs) == 0 || json.Unmarshal(g.Kvs[0].Value, &rec) != nil || rec.SleepImage != "" {
		return
	}
	c.watchChange(ctx, sandboxKey(id), g.Header.Revision, bound)
}

// awaitRound is how long AwaitImported watches before it reads the
// record again: a watch on an etcd that went away neither answers nor
// breaks.
const awaitRound = 10 * time.Second

// AwaitImported waits until the record of id, a fork's child that a node
// is importing, is no longer importing: it answers the record then
// (running on its node), or ok false when the record went (the import
// failed, or its node left and the census removed it). It waits at most
// wait, then answers a retryable Unavailable. A watch from the record's
// revision, not a poll: it changes at most twice.
func (c *Cluster) AwaitImported(ctx context.Context, id string, wait time.Duration) (rec Record, ok bool, err error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for ctx.Err() == nil {
		// Each read and each watch bounded on its own: an etcd that
		// stops answering (a partition, its member down) answers a
		// retryable error within a read's bound, not after the wait.
		gctx, gcancel := c.opCtx(ctx)
		g, err := c.cli.Get(gctx, sandboxKey(id))
		gcancel()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return Record{}, false, unavailable("look up "+id, err)
		}
		if len(g.Kvs) == 0 {
			return Record{}, false, nil
		}
		if err := json.Unmarshal(g.Kvs[0].Value, &rec); err != nil {
			return Record{}, false, fmt.Errorf("cluster: the record of %s does not parse: %w", id, err)
		}
		if rec.State != StateImporting {
			return rec, true, nil
		}
		if !c.watchChange(ctx, sandboxKey(id), g.Header.Revision, awaitRound) {
			// The watch broke (no leader for a moment): read again, not
			// at once.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if err := parent.Err(); err != nil {
		return Record{}, false, err
	}
	return Record{}, false, errdefs.New(errdefs.Unavailable, "sandbox %s is a fork's child that node %s is still importing after %s: try again once it is running", id, rec.Node, wait)
}
