// Package cluster makes clade daemons one cluster over etcd: each node
// registers itself under a lease with its capacity, and writes the
// directory of the sandboxes it holds (id -> node, state, a name unique
// cluster-wide). Service wraps the node's own service.Service with what
// the cluster adds: names checked cluster-wide, the directory kept as
// sandboxes change, calls on a sandbox another node holds sent to that
// node, and the list of nodes.
//
// etcd holds what the cluster must agree on, never memory images or file
// data. The keys, under /clade/:
//
//	nodes/NAME      api.Node of a live node, bound to its lease
//	sandboxes/ID    Record: who holds the sandbox, its state and epoch
//	names/NAME      the id of the sandbox that has the name
//	snapshots/ID    the node that holds a named snapshot (snapdir.go)
//
// Every change of a record is a compare-and-swap transaction on its
// revision. Nothing here imports the lifecycle, an engine or a front: the
// node is reached through internal/service only.
package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
)

const keyPrefix = "/clade/"

func nodeKey(name string) string  { return keyPrefix + "nodes/" + name }
func sandboxKey(id string) string { return keyPrefix + "sandboxes/" + id }
func nameKey(name string) string  { return keyPrefix + "names/" + name }
func nodesPrefix() string         { return keyPrefix + "nodes/" }
func sandboxesPrefix() string     { return keyPrefix + "sandboxes/" }
func drainKey(name string) string { return keyPrefix + "drain/" + name }
func drainPrefix() string         { return keyPrefix + "drain/" }

// Config is a node's part in a cluster.
type Config struct {
	// Node is this node's name, unique in the cluster.
	Node string
	// Addr is where other nodes reach this node's API (HOST:PORT of its
	// --listen); Token is the cluster token they send.
	Addr, Token string
	Version     string
	// LeaseTTL is how long the node's key outlives its lease's last
	// keepalive (default 3 s; one every third of it, at most every
	// Refresh); Refresh how often it writes its capacity (1 s).
	LeaseTTL, Refresh time.Duration
	// LeaseFile keeps the lease's id, so that a restarted node takes its
	// name back at once instead of waiting for its old lease to lapse.
	LeaseFile string
	// MoveTimeout bounds an adopt's fetch of a sleep image from the
	// snapshot store (default 2 min): a hung store must not leave a
	// sandbox moving for long.
	MoveTimeout time.Duration
	// StoreKey is the KeyID of the node's object store (snapstore:
	// "plain", "sealed:ID"; empty without one): written into the records
	// of its sleeping sandboxes with their image, whose moves go only to
	// nodes that publish the same (NodeCapacity.StoreKey).
	StoreKey string
	// StoreRoot, when set, opens the root stream of an image root from
	// the object store (snapstore.Copies.OpenRoot): where a root no live
	// node holds is fetched from (the receiver verifies it).
	StoreRoot func(ctx context.Context, id string) (io.ReadCloser, error)
	// StoreRootBad, when set, deletes the object store's copy of image
	// root id, which this node read from it and refused (why): a bad
	// object would otherwise stay while any image names it, every copy
	// finding it there and uploading nothing (snapstore.Copies.DropBadRoot).
	StoreRootBad func(ctx context.Context, id string, why error)
	// Capacity reads what the node has now.
	Capacity func(ctx context.Context) (api.NodeCapacity, error)
	// Events, when set, is the node's event bus: a sandbox this node
	// marks lost (MarkLost) is published there (events.Lost), so that
	// streams, merged ones too, say so once.
	Events *events.Bus
	Log    *slog.Logger
}

// Cluster is this node's membership: its lease and key, refreshed until
// Close.
type Cluster struct {
	cfg    Config
	cli    *clientv3.Client
	joined time.Time

	mu     sync.Mutex
	lease  clientv3.LeaseID // guarded by mu
	token  string           // this process's name in the root locks (lockToken); guarded by mu
	last   string           // the node key's last value written; guarded by mu
	epochs map[string]int64 // the epoch this node last wrote, by sandbox; guarded by mu
	// lostNodes and lostPass are the live nodes at MarkLost's last pass
	// over the directory, and when; guarded by mu.
	lostNodes string
	lostPass  time.Time

	// rejoined is signalled when the node registered again after its
	// lease lapsed: what it holds must be checked against the directory.
	rejoined chan struct{}
	// check asks keepAlive to check the lease now (a capacity write
	// found the key not the lease's).
	check chan struct{}

	// drain is this node's drain progress, written with its capacity
	// (nil while it is not drained).
	drain atomic.Pointer[api.DrainProgress]

	stop chan struct{}
	done chan struct{}

	// testHook, when set (tests), is called at the image roots' steps.
	testHook func(step string)
}

// hook calls the test hook at step, if one is set.
func (c *Cluster) hook(step string) {
	if h := c.testHook; h != nil {
		h(step)
	}
}

// nodeNameOK allows names that are safe in keys, logs and host names.
func nodeNameOK(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r >= 'A' && r <= 'Z' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// Join registers the node under a new lease and keeps it refreshed until
// Close. A name another live node holds is refused once that node's lease
// has had LeaseTTL to lapse.
func Join(ctx context.Context, cli *clientv3.Client, cfg Config) (*Cluster, error) {
	if !nodeNameOK(cfg.Node) {
		return nil, fmt.Errorf("bad --node %q: give a name of letters, digits, '-', '_' or '.' (at most 63)", cfg.Node)
	}
	if cfg.Addr == "" {
		return nil, errors.New("a cluster node needs an address other nodes reach its API on (--advertise, or --listen)")
	}
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 3*time.Second)
	cfg.Refresh = cmp.Or(cfg.Refresh, time.Second)
	cfg.MoveTimeout = cmp.Or(cfg.MoveTimeout, 2*time.Minute)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Capacity == nil {
		cfg.Capacity = func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{}, nil }
	}
	c := &Cluster{cfg: cfg, cli: cli, joined: time.Now().UTC(), stop: make(chan struct{}), done: make(chan struct{}),
		epochs: map[string]int64{}, rejoined: make(chan struct{}, 1), check: make(chan struct{}, 1)}
	// A lease of this node's last life: its key goes now, not in TTL.
	if b, err := os.ReadFile(cfg.LeaseFile); err == nil && cfg.LeaseFile != "" {
		if id, err := strconv.ParseInt(strings.TrimSpace(string(b)), 16, 64); err == nil {
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); err == nil {
				cfg.Log.Info("cluster: revoked the lease of this node's last run", "lease", fmt.Sprintf("%x", id))
			}
		}
	}
	if err := c.register(ctx); err != nil {
		return nil, err
	}
	go c.run()
	return c, nil
}

// register grants a lease and claims the node's key with it. The key's
// value is its last one when there is one (a node taken back after its
// lease lapsed does not wait for a capacity read; the next refresh writes
// a new one), read before the lease is granted.
func (c *Cluster) register(ctx context.Context) error {
	deadline := time.Now().Add(2 * c.cfg.LeaseTTL)
	_, v := c.current()
	if v == "" {
		var err error
		if v, err = c.value(ctx); err != nil {
			return err
		}
	}
	for {
		l, err := c.cli.Grant(ctx, int64((c.cfg.LeaseTTL+time.Second-1)/time.Second))
		if err != nil {
			return fmt.Errorf("etcd: grant a lease: %w", err)
		}
		k := nodeKey(c.cfg.Node)
		r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, v, clientv3.WithLease(l.ID))).Commit()
		if err != nil {
			return fmt.Errorf("etcd: register node %s: %w", c.cfg.Node, err)
		}
		if r.Succeeded {
			c.mu.Lock()
			c.lease, c.last = l.ID, v
			c.mu.Unlock()
			if c.cfg.LeaseFile != "" {
				_ = os.WriteFile(c.cfg.LeaseFile, []byte(fmt.Sprintf("%x\n", int64(l.ID))), 0o600)
			}
			c.cfg.Log.Info("cluster: joined", "node", c.cfg.Node, "addr", c.cfg.Addr, "lease", fmt.Sprintf("%x", int64(l.ID)))
			return nil
		}
		_, _ = c.cli.Revoke(ctx, l.ID)
		if time.Now().After(deadline) {
			return fmt.Errorf("another live daemon is node %s of this cluster: give this one another --node, or stop that one", c.cfg.Node)
		}
		// Its lease may be lapsing (a daemon killed without its lease
		// file): wait for the key to go.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(c.cfg.LeaseTTL / 4):
		}
	}
}

// value is the node's key's value now.
func (c *Cluster) value(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Refresh)
	defer cancel()
	// The time before the capacity is read: placement counts a create
	// that answered after it against the node until a later refresh (a
	// time taken after the read would drop one the read missed).
	at := time.Now().UTC()
	capy, err := c.cfg.Capacity(cctx)
	if err != nil {
		c.cfg.Log.Debug("cluster: read capacity", "err", err)
	}
	b, err := json.Marshal(api.Node{Name: c.cfg.Node, Addr: c.cfg.Addr, Version: c.cfg.Version, Capacity: capy,
		JoinedAt: c.joined, RefreshedAt: at, Drain: c.drain.Load()})
	return string(b), err
}

// run keeps the node's lease alive and its key's capacity fresh until
// Close, in two loops: the keepalive never waits for a capacity read (a
// slow one, on a loaded host, must not let the lease of a live node lapse
// and its sandboxes be marked lost).
func (c *Cluster) run() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-c.stop; cancel() }()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.keepAlive(ctx)
	}()
	defer wg.Wait()
	t := time.NewTicker(c.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.refresh(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Log.Warn("cluster: refresh this node's key", "err", err)
		}
	}
}

// keepAlive renews the node's lease every third of its TTL (at most every
// Refresh); a lease that lapsed (etcd out of reach for longer than the
// TTL) is taken again, with the key's last value (no capacity read).
func (c *Cluster) keepAlive(ctx context.Context) {
	t := time.NewTicker(max(min(c.cfg.Refresh, c.cfg.LeaseTTL/3), 10*time.Millisecond))
	defer t.Stop()
	for {
		checkKey := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.check:
			checkKey = true
		}
		lease, _ := c.current()
		kctx, kcancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
		_, err := c.cli.KeepAliveOnce(kctx, lease)
		if err == nil && checkKey && !c.keyIsLease(kctx, lease) {
			err = rpctypes.ErrLeaseNotFound // the key went without the lease: taken again
		}
		kcancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.cfg.Log.Warn("cluster: keep this node's lease alive", "err", err)
			continue
		}
		c.cfg.Log.Warn("cluster: this node's lease lapsed; joining again", "node", c.cfg.Node)
		if err := c.register(ctx); err != nil {
			if ctx.Err() == nil {
				c.cfg.Log.Error("cluster: join again", "err", err)
			}
			continue
		}
		select {
		case c.rejoined <- struct{}{}:
		default:
		}
	}
}

// keyIsLease is whether the node's key is bound to lease (etcd out of
// reach: it is taken to be).
func (c *Cluster) keyIsLease(ctx context.Context, lease clientv3.LeaseID) bool {
	r, err := c.cli.Get(ctx, nodeKey(c.cfg.Node))
	return err != nil || len(r.Kvs) > 0 && clientv3.LeaseID(r.Kvs[0].Lease) == lease
}

// current is the node's lease and its key's last value.
func (c *Cluster) current() (clientv3.LeaseID, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease, c.last
}

// refresh rewrites the node's key with its capacity now.
func (c *Cluster) refresh(ctx context.Context) error {
	v, err := c.value(ctx)
	if err != nil {
		return err
	}
	// The lease after the read: one taken again meanwhile is the one
	// the key is bound to.
	lease, _ := c.current()
	cctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseTTL)
	defer cancel()
	// Only while the key is still this lease's: a lapsed one is taken
	// again by keepAlive (asked to check now), never written over a
	// newcomer's.
	k := nodeKey(c.cfg.Node)
	r, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.LeaseValue(k), "=", lease)).
		Then(clientv3.OpPut(k, v, clientv3.WithLease(lease))).Commit()
	if err != nil {
		return err
	}
	if !r.Succeeded {
		select {
		case c.check <- struct{}{}:
		default:
		}
		return nil
	}
	c.mu.Lock()
	if c.lease == lease {
		c.last = v
	}
	c.mu.Unlock()
	return nil
}

// Close stops refreshing and revokes the lease: the node leaves the
// cluster at once. Its directory records stay (the sandboxes outlive the
// daemon).
func (c *Cluster) Close() {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.cli.Revoke(ctx, lease); err == nil && c.cfg.LeaseFile != "" {
		_ = os.Remove(c.cfg.LeaseFile)
	}
}

// opTimeout bounds every etcd call a request makes: an etcd out of reach
// is a retryable error that says so, never a call that hangs.
const opTimeout = 5 * time.Second

func (c *Cluster) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}

func (c *Cluster) epoch(id string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epochs[id]
}

func (c *Cluster) setEpoch(id string, e int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e == 0 {
		delete(c.epochs, id)
	} else {
		c.epochs[id] = e
	}
}

// Name is this node's name.
func (c *Cluster) Name() string { return c.cfg.Node }

// Nodes reads the live nodes, by name.
func (c *Cluster) Nodes(ctx context.Context) ([]api.Node, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Txn(ctx).Then(clientv3.OpGet(nodesPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(drainPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return nil, unavailable("read the nodes", err)
	}
	draining := map[string]bool{}
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		draining[string(kv.Key[len(drainPrefix()):])] = true
	}
	now := time.Now()
	var out []api.Node
	for _, kv := range r.Responses[0].GetResponseRange().Kvs {
		var n api.Node
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			c.cfg.Log.Warn("cluster: a node key that does not parse", "key", string(kv.Key), "err", err)
			continue
		}
		n.Self = n.Name == c.cfg.Node
		n.Draining = draining[n.Name]
		n.LeaseAgeMS = max(0, now.Sub(n.RefreshedAt).Milliseconds())
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b api.Node) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// node reads one live node.
func (c *Cluster) node(ctx context.Context, name string) (api.Node, bool, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Get(ctx, nodeKey(name))
	if err != nil {
		return api.Node{}, false, unavailable("read node "+name, err)
	}
	if len(r.Kvs) == 0 {
		return api.Node{}, false, nil
	}
	var n api.Node
	err = json.Unmarshal(r.Kvs[0].Value, &n)
	return n, err == nil, err
}

// Drain marks (on) or unmarks the named live node as draining: placement
// picks it no more. The mark (drain/NAME, without a lease) outlives the
// node's restarts until it is taken off.
func (c *Cluster) Drain(ctx context.Context, name string, on bool) (api.Node, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	nk := nodeKey(name)
	op := clientv3.OpDelete(drainKey(name))
	if on {
		op = clientv3.OpPut(drainKey(name), time.Now().UTC().Format(time.RFC3339))
	}
	// Only for a live node: a typo must not drain nothing silently.
	r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(nk), ">", 0)).Then(op, clientv3.OpGet(nk)).Commit()
	if err != nil {
		return api.Node{}, unavailable("drain node "+name, err)
	}
	if !r.Succeeded {
		return api.Node{}, errdefs.New(errdefs.NotFound, "no live node %q in the cluster (clade node ls lists them)", name)
	}
	var n api.Node
	if kvs := r.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		if err := json.Unmarshal(kvs[0].Value, &n); err != nil {
			return api.Node{}, err
		}
	}
	n.Self, n.Draining = n.Name == c.cfg.Node, on
	if on {
		c.cfg.Log.Info("cluster: node drained", "node", name)
	} else {
		c.cfg.Log.Info("cluster: node undrained", "node", name)
	}
	return n, nil
}
