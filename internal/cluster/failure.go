package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
)

// StateLost is the state of a sandbox whose node left the cluster (its
// lease lapsed) while the sandbox was not asleep. The cluster never
// recreates it; its record stays, with the reason, until it is removed.
const StateLost = "lost"

// MarkLost turns the records of sandboxes on nodes that are no longer in
// the cluster into lost ones, at the next epoch: the node, should it come
// back, finds its hold fenced and cleans the sandbox; each one this node
// marks is published on its event bus (Config.Events). Sleeping sandboxes
// keep their record (their image is on their node, which may return).
// Each record changes in a transaction that holds only while its node's
// key is still absent, so a node that rejoined in the meantime keeps its
// sandboxes. Any node may run it; the compare-and-swap makes one win.
//
// The directory is read only when the set of live nodes changed since the
// last pass, or 10 s went by: a pass every second is one keys-only read.
func (c *Cluster) MarkLost(ctx context.Context) (int, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	nr, err := c.cli.Get(ctx, nodesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, unavailable("read the nodes", err)
	}
	var names []string
	for _, kv := range nr.Kvs {
		names = append(names, string(kv.Key))
	}
	set := strings.Join(names, ",")
	c.mu.Lock()
	skip := set == c.lostNodes && time.Since(c.lostPass) < 10*time.Second
	c.mu.Unlock()
	if skip {
		return 0, nil
	}
	n, err := c.markLost(ctx)
	if err == nil {
		c.mu.Lock()
		c.lostNodes, c.lostPass = set, time.Now()
		c.mu.Unlock()
	}
	return n, err
}

func (c *Cluster) markLost(ctx context.Context) (int, error) {
	r, err := c.cli.Txn(ctx).Then(clientv3.OpGet(nodesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(sandboxesPrefix(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, unavailable("read the nodes and the directory", err)
	}
	live := map[string]bool{}
	for _, kv := range r.Responses[0].GetResponseRange().Kvs {
		live[string(kv.Key[len(nodesPrefix()):])] = true
	}
	n := 0
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		var rec Record
		// A sleeping sandbox keeps its record (with its image in the
		// snapshot store it wakes elsewhere, see move.go), and so does
		// one whose move a gone node left (its claim lapsed).
		if json.Unmarshal(kv.Value, &rec) != nil || live[rec.Node] || rec.State == StateLost || rec.State == "sleeping" ||
			rec.State == StateMoving && rec.SleepImage != "" {
			continue
		}
		if rec.State == StateImporting {
			// A fork's child its node did not make: never a sandbox,
			// nothing to keep (the fork's answer named it failed).
			t, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision),
				clientv3.Compare(clientv3.CreateRevision(nodeKey(rec.Node)), "=", 0)).
				Then(clientv3.OpDelete(string(kv.Key))).Commit()
			if err != nil {
				return n, unavailable("remove "+rec.ID+", a fork child its node left unmade", err)
			}
			if t.Succeeded {
				c.cfg.Log.Info("cluster: removed a fork child's record its node left importing", "sandbox", rec.ID, "node", rec.Node)
			}
			continue
		}
		now := time.Now().UTC()
		rec.Reason = fmt.Sprintf("node %s left the cluster (its lease lapsed) while the sandbox was %s; clade does not recreate it: remove it and create another", rec.Node, rec.State)
		rec.State, rec.Epoch, rec.UpdatedAt = StateLost, rec.Epoch+1, now
		rec.Sandbox.State, rec.Sandbox.Error = StateLost, rec.Reason
		b, err := json.Marshal(rec)
		if err != nil {
			return n, err
		}
		t, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision),
			clientv3.Compare(clientv3.CreateRevision(nodeKey(rec.Node)), "=", 0)).
			Then(clientv3.OpPut(string(kv.Key), string(b))).Commit()
		applied := err == nil && t.Succeeded
		if err != nil {
			// A transaction can be applied though its answer was
			// lost (a timeout, a member gone mid-call): the record
			// then holds these very bytes (its time is to the
			// nanosecond), and the event is this node's to send, as
			// no later pass marks a lost record again.
			if !c.appliedLost(ctx, string(kv.Key), b) {
				return n, unavailable("mark "+rec.ID+" lost", err)
			}
			applied = true
		}
		if applied {
			n++
			c.cfg.Log.Warn("cluster: sandbox lost with its node", "sandbox", rec.ID, "node", rec.Node, "epoch", rec.Epoch)
			if c.cfg.Events != nil {
				// Once: only the node whose transaction succeeded says it.
				c.cfg.Events.Publish(events.Event{Type: events.Lost, Sandbox: rec.ID, Name: rec.Name,
					Labels: rec.Sandbox.Labels, Reason: rec.Reason})
			}
		}
	}
	return n, nil
}

// appliedLost reports whether key holds want, re-read after a mark whose
// answer did not come.
func (c *Cluster) appliedLost(ctx context.Context, key string, want []byte) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r, err := c.cli.Get(rctx, key)
	return err == nil && len(r.Kvs) == 1 && bytes.Equal(r.Kvs[0].Value, want)
}

// lostError is the answer to a call on a lost sandbox.
func lostError(rec Record) error {
	return errdefs.New(errdefs.Conflict, "sandbox %s is lost: %s", rec.ID, rec.Reason)
}
