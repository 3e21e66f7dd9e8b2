package cluster

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// SnapshotRecord is a named (not implicit) snapshot's entry in the
// directory, snapshots/ID: the node that holds it, so that a fork of it
// through any node goes there. A node that restores children of it keeps
// a copy only as long as its children (an implicit snapshot of its own),
// and is not listed.
type SnapshotRecord struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Node      string    `json:"node"`
	Image     string    `json:"image"`
	UpdatedAt time.Time `json:"updated_at"`
}

func snapshotKey(id string) string { return keyPrefix + "snapshots/" + id }
func snapshotsPrefix() string      { return keyPrefix + "snapshots/" }

// PublishSnapshot writes the record of a snapshot this node holds: one
// write per snapshot, none per fork.
func (c *Cluster) PublishSnapshot(ctx context.Context, sn api.Snapshot) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	b, err := json.Marshal(SnapshotRecord{ID: sn.ID, Name: sn.Name, Node: c.cfg.Node, Image: sn.Image, UpdatedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := c.cli.Put(ctx, snapshotKey(sn.ID), string(b)); err != nil {
		return unavailable("write the record of snapshot "+sn.ID, err)
	}
	return nil
}

// UnpublishSnapshot removes the record of a snapshot this node held.
func (c *Cluster) UnpublishSnapshot(ctx context.Context, id string) error {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	k := snapshotKey(id)
	r, err := c.cli.Get(ctx, k)
	if err != nil {
		return unavailable("read the record of snapshot "+id, err)
	}
	if len(r.Kvs) == 0 {
		return nil
	}
	var rec SnapshotRecord
	if json.Unmarshal(r.Kvs[0].Value, &rec) == nil && rec.Node != c.cfg.Node {
		return nil // another node's
	}
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", r.Kvs[0].ModRevision)).Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return unavailable("remove the record of snapshot "+id, err)
	}
	return nil
}

// LookupSnapshot finds a snapshot's record by id or name.
func (c *Cluster) LookupSnapshot(ctx context.Context, ref string) (SnapshotRecord, bool, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Get(ctx, snapshotKey(ref))
	if err != nil {
		return SnapshotRecord{}, false, unavailable("look up snapshot "+ref, err)
	}
	var rec SnapshotRecord
	if len(r.Kvs) > 0 && json.Unmarshal(r.Kvs[0].Value, &rec) == nil {
		return rec, true, nil
	}
	// By name: snapshots are few (named ones only).
	all, err := c.cli.Get(ctx, snapshotsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return SnapshotRecord{}, false, unavailable("look up snapshot "+ref, err)
	}
	for _, kv := range all.Kvs {
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Name == ref {
			return rec, true, nil
		}
	}
	return SnapshotRecord{}, false, nil
}

// Snapshot snapshots the sandbox where it is; a snapshot of this node's
// is written to the directory, so that a fork of it through any node
// finds it.
func (s *Service) Snapshot(ctx context.Context, ref, name string) (api.Snapshot, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	sn, err := svc.Snapshot(ctx, ref, name)
	if err != nil || svc != s.Service {
		return sn, err
	}
	if err := s.c.PublishSnapshot(ctx, sn); err != nil {
		s.c.cfg.Log.Warn("cluster: write a snapshot's record", "snapshot", sn.ID, "err", err)
	}
	return sn, nil
}

// snapshotService is the service that holds snapshot ref: this node's,
// else the live node the directory names (the part that forks finds
// snapshots across nodes).
func (f *forks) snapshotService(ctx context.Context, ref string) (snapshotHolder, error) {
	if _, err := f.local.GetSnapshot(ctx, ref); err == nil || !errdefs.IsNotFound(err) {
		return f.local, nil
	}
	rec, ok, err := f.c.LookupSnapshot(ctx, ref)
	if err != nil || !ok || rec.Node == f.c.cfg.Node {
		return f.local, err
	}
	n, live, err := f.c.node(ctx, rec.Node)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, errdefs.New(errdefs.Unavailable, "snapshot %s is on node %s, which is not in the cluster now: try again when it is back", ref, rec.Node)
	}
	return f.svc.remote(n)
}

type snapshotHolder interface {
	GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error)
	RemoveSnapshot(ctx context.Context, ref string) error
}

// GetSnapshot reads the snapshot where it is.
func (s *Service) GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	h, err := s.forks.snapshotService(ctx, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	return h.GetSnapshot(ctx, ref)
}

// RemoveSnapshot removes the snapshot where it is, and its record.
func (s *Service) RemoveSnapshot(ctx context.Context, ref string) error {
	h, err := s.forks.snapshotService(ctx, ref)
	if err != nil {
		return err
	}
	if h != snapshotHolder(s.Service) {
		return h.RemoveSnapshot(ctx, ref)
	}
	sn, err := s.Service.GetSnapshot(ctx, ref)
	if err != nil {
		return err
	}
	if err := s.Service.RemoveSnapshot(ctx, ref); err != nil {
		return err
	}
	if err := s.c.UnpublishSnapshot(ctx, sn.ID); err != nil {
		s.c.cfg.Log.Warn("cluster: remove a snapshot's record", "snapshot", sn.ID, "err", err)
	}
	return nil
}
