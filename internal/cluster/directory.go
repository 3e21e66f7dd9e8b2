package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Record is a sandbox's entry in the cluster directory.
type Record struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	State string `json:"state"`
	Name  string `json:"name,omitempty"`
	// Epoch is the record's fencing number: it rises when the sandbox
	// changes hands, so that a node acts on a sandbox only while the
	// record still names it at the epoch it knows.
	Epoch     int64     `json:"epoch"`
	UpdatedAt time.Time `json:"updated_at"`
	// Reason says why a lost sandbox is lost.
	Reason string `json:"reason,omitempty"`
	// Sandbox is the holder's view for the cluster's list, without what
	// stays on the node (environment, traffic token).
	Sandbox api.Sandbox `json:"sandbox"`
	// SleepImage is the digest of a sleeping sandbox's image in the
	// snapshot store (--object-store): any node can wake it (move.go).
	SleepImage string `json:"sleep_image,omitempty"`
	// SleepKey is the StoreKey of the node that sealed the image: only a
	// node with the same key opens it (empty in an older node's record).
	SleepKey string `json:"sleep_key,omitempty"`
}

// nameValue is a names/NAME key's value: the sandbox that has the name,
// or (ID empty) a node's reservation for a create under way, bound to that
// node's lease.
type nameValue struct {
	ID   string `json:"id,omitempty"`
	Node string `json:"node"`
}

func unavailable(what string, err error) error {
	return errdefs.New(errdefs.Unavailable, "cluster: %s: etcd does not answer (%v); try again", what, err)
}

// summary is what the directory keeps of a sandbox.
func summary(sb api.Sandbox, node string) api.Sandbox {
	sb.Node = node
	sb.Env = nil
	sb.Ingress = nil
	sb.SleepImage = "" // the record has its own (Record.SleepImage)
	return sb
}

// ReserveName claims name for a create on this node. The reservation is
// bound to the node's lease (a node that dies mid-create frees it) until
// Publish turns it into the sandbox's, or release drops it. A name another
// sandbox or create holds is AlreadyExists.
func (c *Cluster) ReserveName(ctx context.Context, name string) (release func(), err error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	k := nameKey(name)
	v, _ := json.Marshal(nameValue{Node: c.cfg.Node})
	r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(v), clientv3.WithLease(lease))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return nil, unavailable("reserve the name "+name, err)
	}
	if !r.Succeeded {
		var held nameValue
		if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &held)
		}
		if held.ID == "" {
			return nil, errdefs.New(errdefs.AlreadyExists, "the name %q is being taken by a create on node %s of the cluster: pick another", name, held.Node)
		}
		return nil, errdefs.New(errdefs.AlreadyExists, "the name %q is taken in the cluster (sandbox %s on node %s): pick another, or remove that one", name, held.ID, held.Node)
	}
	rev := r.Header.Revision
	return func() {
		// Only the reservation itself: never a name Publish gave away.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).Then(clientv3.OpDelete(k)).Commit()
	}, nil
}

// errNotHolder is Publish's and Unpublish's refusal of a record another
// node holds.
var errNotHolder = errors.New("another node holds the record")

// errFenced is Publish's refusal of a record the cluster took from this
// node (lost while its lease had lapsed, or at an epoch past the one this
// node knows): the node must stop and clean the sandbox, never write it.
var errFenced = errors.New("the cluster no longer gives this node the sandbox")

// Publish writes the directory record of a sandbox this node holds, and
// its name, with compare-and-swap on their revisions (retried on a race).
// A record another node holds is never written over (errNotHolder); a
// name another sandbox has is left to it (the record then has no name).
func (c *Cluster) Publish(ctx context.Context, sb api.Sandbox) error {
	return c.PublishImage(ctx, sb, "")
}

// PublishImage is Publish of a record that names img, the digest of the
// sleeping sandbox's image in the snapshot store ("" none).
func (c *Cluster) PublishImage(ctx context.Context, sb api.Sandbox, img string) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	for try := 0; ; try++ {
		err := c.publish(ctx, sb, img, 0)
		if !errors.Is(err, errRace) || try == 4 {
			return err
		}
	}
}

// PublishCopied writes sleeping sandbox id's record again to name its
// sleep image's copy (view reads the node's sandbox and that copy's
// digest), only over the record this node wrote of it asleep without
// one: a record the sandbox left meanwhile (woken, its wake's write, or
// given to another node) stays as it is. view is read after the record
// and the write compares the record's revision, so a wake (or a wake and
// a sleep again) after view's read, whose own write comes first, is never
// overwritten with the image it woke from. Nothing to write is nil.
func (c *Cluster) PublishCopied(ctx context.Context, id string, view func(context.Context) (api.Sandbox, string, error)) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	for try := 0; ; try++ {
		g, err := c.cli.Get(ctx, sandboxKey(id))
		if err != nil {
			return unavailable("read the record of "+id, err)
		}
		var old Record
		if len(g.Kvs) == 0 || json.Unmarshal(g.Kvs[0].Value, &old) != nil ||
			old.Node != c.cfg.Node || old.State != "sleeping" || old.SleepImage != "" {
			return nil
		}
		sb, img, err := view(ctx)
		if err != nil || sb.State != "sleeping" || img == "" {
			return err
		}
		err = c.publish(ctx, sb, img, g.Kvs[0].ModRevision)
		if !errors.Is(err, errRace) || try == 4 {
			return err
		}
	}
}

var errRace = errors.New("the record changed under the write")

// publish writes sb's record naming img; at, when not 0, is the
// revision the record must still be at (errRace otherwise).
func (c *Cluster) publish(ctx context.Context, sb api.Sandbox, img string, at int64) error {
	sk := sandboxKey(sb.ID)
	ops := []clientv3.Op{clientv3.OpGet(sk)}
	if sb.Name != "" {
		ops = append(ops, clientv3.OpGet(nameKey(sb.Name)))
	}
	cur, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return unavailable("read the record of "+sb.ID, err)
	}
	rec := Record{ID: sb.ID, Node: c.cfg.Node, State: sb.State, Name: sb.Name, Epoch: 1, UpdatedAt: time.Now().UTC(), Sandbox: summary(sb, c.cfg.Node), SleepImage: img}
	if img != "" {
		rec.SleepKey = c.cfg.StoreKey
	}
	var conds []clientv3.Cmp
	var then []clientv3.Op
	var old Record
	if kvs := cur.Responses[0].GetResponseRange().Kvs; at != 0 && (len(kvs) == 0 || kvs[0].ModRevision != at) {
		return errRace
	}
	if kvs := cur.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if err := json.Unmarshal(kvs[0].Value, &old); err == nil && old.Node != c.cfg.Node {
			if old.Epoch > 1 && old.Epoch > c.epoch(sb.ID) {
				// Moved to another node (move.go: a move raises the
				// epoch) after this node's last write: this node's
				// copy is stale.
				return fmt.Errorf("sandbox %s: node %s holds its record at epoch %d: %w", sb.ID, old.Node, old.Epoch, errFenced)
			}
			return fmt.Errorf("sandbox %s: node %s holds its record at epoch %d: %w", sb.ID, old.Node, old.Epoch, errNotHolder)
		}
		if known := c.epoch(sb.ID); old.State == StateLost || known > 0 && old.Epoch > known {
			return fmt.Errorf("sandbox %s: its record is at epoch %d (%s), this node knew %d: %w", sb.ID, old.Epoch, old.State, known, errFenced)
		}
		rec.Epoch = max(old.Epoch, 1)
		conds = append(conds, clientv3.Compare(clientv3.ModRevision(sk), "=", kvs[0].ModRevision))
	} else {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
	}
	if sb.Name != "" {
		nk := nameKey(sb.Name)
		var held nameValue
		kvs := cur.Responses[1].GetResponseRange().Kvs
		if len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &held)
		}
		switch {
		case len(kvs) > 0 && held.ID == sb.ID && held.Node == c.cfg.Node:
			// Already the sandbox's.
		case len(kvs) == 0 || held.ID == "" && held.Node == c.cfg.Node || held.ID == sb.ID:
			// (held.ID == sb.ID on another node: the sandbox moved here,
			// and its name follows it, so that its remove here frees it.)
			// Free, or this node's reservation: the sandbox's now, for as
			// long as the sandbox is (no lease).
			v, _ := json.Marshal(nameValue{ID: sb.ID, Node: c.cfg.Node})
			if len(kvs) == 0 {
				conds = append(conds, clientv3.Compare(clientv3.CreateRevision(nk), "=", 0))
			} else {
				conds = append(conds, clientv3.Compare(clientv3.ModRevision(nk), "=", kvs[0].ModRevision))
			}
			then = append(then, clientv3.OpPut(nk, string(v)))
		default:
			c.cfg.Log.Warn("cluster: a sandbox's name is another's in the cluster; its record has none", "sandbox", sb.ID, "name", sb.Name, "holder", held.ID, "node", held.Node)
			rec.Name = ""
		}
	}
	if len(then) == 0 && sameRecord(old, rec) {
		// Nothing the cluster sees changed (an event that moved no
		// state): no write, so that etcd is written per create and per
		// state change, never per exec or event.
		c.setEpoch(sb.ID, rec.Epoch)
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	then = append(then, clientv3.OpPut(sk, string(b)))
	r, err := c.cli.Txn(ctx).If(conds...).Then(then...).Commit()
	if err != nil {
		return unavailable("write the record of "+sb.ID, err)
	}
	if !r.Succeeded {
		return errRace
	}
	c.setEpoch(sb.ID, rec.Epoch)
	return nil
}

// Unpublish removes the record of a sandbox this node held, and its name.
// A record that is gone is nil; one another node holds is errNotHolder.
// A lost record stays unless force (a remove of the lost sandbox): a
// fenced node cleaning up must leave the user the record of what was
// lost.
func (c *Cluster) Unpublish(ctx context.Context, id string, force bool) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	known := c.epoch(id)
	c.setEpoch(id, 0)
	for try := 0; ; try++ {
		sk := sandboxKey(id)
		cur, err := c.cli.Get(ctx, sk)
		if err != nil {
			return unavailable("read the record of "+id, err)
		}
		if len(cur.Kvs) == 0 {
			return nil
		}
		var rec Record
		err = json.Unmarshal(cur.Kvs[0].Value, &rec)
		switch {
		case err == nil && rec.State == StateLost && !force:
			return nil
		case err == nil && rec.Node != c.cfg.Node && !(force && rec.State == StateLost):
			return fmt.Errorf("sandbox %s: node %s holds its record: %w", id, rec.Node, errNotHolder)
		case err == nil && !force && rec.SleepImage != "" && (rec.State == StateMoving || rec.State == "sleeping" && rec.Epoch > max(known, 1)):
			// Being moved here (a claim, live or lapsed: the adopt or the
			// census settles it), or given to this node by a move after
			// the node's last write (it dropped a stale copy: the
			// record's image is to be adopted here): not this node's to
			// drop when it has no copy (keepUnheld keeps it too).
			return nil
		}
		then := []clientv3.Op{clientv3.OpDelete(sk)}
		conds := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sk), "=", cur.Kvs[0].ModRevision)}
		if rec.Name != "" {
			// The name goes if it is still this sandbox's, whichever
			// node its value names (a moved sandbox's may name the node
			// it was created on).
			nk := nameKey(rec.Name)
			nr, err := c.cli.Get(ctx, nk)
			if err != nil {
				return unavailable("read the name of "+id, err)
			}
			var held nameValue
			if len(nr.Kvs) > 0 && json.Unmarshal(nr.Kvs[0].Value, &held) == nil && held.ID == id {
				conds = append(conds, clientv3.Compare(clientv3.ModRevision(nk), "=", nr.Kvs[0].ModRevision))
				then = append(then, clientv3.OpDelete(nk))
			}
		}
		r, err := c.cli.Txn(ctx).If(conds...).Then(then...).Commit()
		if err != nil {
			return unavailable("remove the record of "+id, err)
		}
		if r.Succeeded || try == 4 {
			return nil
		}
	}
}

// Lookup finds a sandbox's record by id or name; ok is false when the
// directory has none.
func (c *Cluster) Lookup(ctx context.Context, ref string) (rec Record, ok bool, err error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Txn(ctx).Then(clientv3.OpGet(sandboxKey(ref)), clientv3.OpGet(nameKey(ref))).Commit()
	if err != nil {
		return Record{}, false, unavailable("look up "+ref, err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		var nv nameValue
		nkvs := r.Responses[1].GetResponseRange().Kvs
		if len(nkvs) == 0 || json.Unmarshal(nkvs[0].Value, &nv) != nil || nv.ID == "" {
			return Record{}, false, nil
		}
		g, err := c.cli.Get(ctx, sandboxKey(nv.ID))
		if err != nil {
			return Record{}, false, unavailable("look up "+ref, err)
		}
		kvs = g.Kvs
		if len(kvs) == 0 {
			return Record{}, false, nil
		}
	}
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return Record{}, false, fmt.Errorf("cluster: the record of %s does not parse: %w", ref, err)
	}
	return rec, true, nil
}

// Records reads the whole directory.
func (c *Cluster) Records(ctx context.Context) ([]Record, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Get(ctx, sandboxesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, unavailable("read the directory", err)
	}
	out := make([]Record, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		var rec Record
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			c.cfg.Log.Warn("cluster: a record that does not parse", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// sameRecord is whether a and b differ at most in their write time.
func sameRecord(a, b Record) bool {
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
