package system

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/internal/engine/multi"
	"github.com/clade-sandbox/clade/internal/hostinfo"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/store"
)

// ClusterOptions is a daemon's part in a cluster (--cluster ...). A zero
// value (Etcd empty) is a daemon outside any cluster: no etcd at all.
type ClusterOptions struct {
	// Etcd is "embed" (an etcd member in the daemon) or
	// etcd://HOST:PORT[,HOST:PORT...].
	Etcd string
	// Node names this daemon in the cluster; Advertise is the address
	// other nodes reach its API on (default: --listen).
	Node, Advertise string
	// EmbedListen and EmbedPeerListen are the embedded member's client
	// and peer addresses; EmbedPeers its initial cluster
	// (NAME=http://HOST:PORT,...) for a multi-member etcd.
	EmbedListen, EmbedPeerListen, EmbedPeers string
	// LeaseTTL is how long the node's key outlives its last refresh.
	LeaseTTL time.Duration
	// MoveTimeout bounds a move's fetch of a sleep image from the object
	// store (--cluster-move-timeout).
	MoveTimeout time.Duration
	// Token is the cluster token (--cluster-token-file) the nodes call
	// each other with; empty: the API token (--token-file) is it.
	Token string
	// Etcd's client TLS (CA, Cert, Key: PEM files) and auth (User,
	// Password); see cluster.EtcdAuth.
	EtcdAuth cluster.EtcdAuth
}

// token is the cluster token: --cluster-token-file's, else the API's.
func (co ClusterOptions) token(apiToken string) string { return cmpOr(co.Token, apiToken) }

// joinCluster starts the embedded etcd (if asked), joins the cluster and
// returns the service the fronts use, with what to stop at exit.
func joinCluster(ctx context.Context, o Options, local service.Service, mgr *sandbox.Manager, st *store.Store, eng *multi.Engine, log *slog.Logger) (*cluster.Service, func(), error) {
	co := o.Cluster
	if o.Listen == "" || o.Token == "" {
		return nil, nil, errors.New("--cluster needs --listen and --token-file: other nodes reach this one's API there, with the cluster token (--cluster-token-file, else the --token-file token: the same on every node)")
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	var endpoints []string
	if co.Etcd == "embed" {
		e, err := cluster.StartEmbed(ctx, cluster.Embed{Name: co.Node, Dir: filepath.Join(o.DataDir, "etcd"),
			Client: co.EmbedListen, Peer: co.EmbedPeerListen, Peers: co.EmbedPeers, Auth: co.EtcdAuth, Log: log})
		if err != nil {
			return nil, nil, err
		}
		stops = append(stops, e.Close)
		endpoints = e.Endpoints
		log.Info("cluster: embedded etcd serving", "client", co.EmbedListen, "peer", co.EmbedPeerListen)
	} else {
		var err error
		if endpoints, err = cluster.ParseEndpoints(co.Etcd); err != nil {
			return nil, nil, err
		}
	}
	cli, err := cluster.DialAuth(ctx, endpoints, 10*time.Second, co.EtcdAuth)
	if err != nil {
		stop()
		return nil, nil, err
	}
	stops = append(stops, func() { cli.Close() })
	capacity := func(ctx context.Context) (api.NodeCapacity, error) { return nodeCapacity(ctx, o, local, st, eng) }
	c, err := cluster.Join(ctx, cli, cluster.Config{Node: co.Node, Addr: cmpOr(co.Advertise, o.Listen), Token: co.token(o.Token),
		Version: o.Version, LeaseTTL: co.LeaseTTL, MoveTimeout: co.MoveTimeout, StoreKey: o.Sandbox.Copies.KeyID(), StoreRoot: storeRoot(o.Sandbox.Copies), StoreRootBad: o.Sandbox.Copies.DropBadRoot,
		LeaseFile: filepath.Join(o.DataDir, "cluster-lease"), Capacity: capacity, Events: mgr.Events(), Log: log})
	if err != nil {
		stop()
		return nil, nil, err
	}
	stops = append(stops, c.Close)
	// Image roots copied to the object store have their digest kept in
	// the directory, where a wake checks a root from the store against it.
	o.Sandbox.Copies.SetRootSums(c)
	svc := cluster.NewService(c, local)
	// A sleeping sandbox's record names its image as soon as the copy is
	// sealed: another node may wake it from then on.
	o.Sandbox.Copies.OnCopied(func(string) { svc.CopyMade() })
	svc.SetPorter(porter{sandbox.NewPorter(mgr)})
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := svc.Sync(sctx); err != nil && sctx.Err() == nil {
			log.Error("cluster: the directory is no longer written", "err", err)
		}
	}()
	stops = append(stops, func() { cancel(); <-done })
	return svc, stop, nil
}

// storeRoot is where a node fetches an image root no live node holds:
// the object store (nil without one).
func storeRoot(c *snapstore.Copies) func(ctx context.Context, id string) (io.ReadCloser, error) {
	if c == nil {
		return nil
	}
	return c.OpenRoot
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// nodeCapacity is what the node tells the cluster it has.
func nodeCapacity(ctx context.Context, o Options, local service.Service, st *store.Store, eng *multi.Engine) (api.NodeCapacity, error) {
	c := api.NodeCapacity{Cores: runtime.NumCPU(), StoreKey: o.Sandbox.Copies.KeyID()}
	var errs []error
	var err error
	if c.MemoryTotalMiB, err = hostinfo.MemTotalMiB(); err != nil {
		errs = append(errs, err)
	}
	// What admission holds creates to (sandbox.Manager's rules), so that
	// placement picks a node that admits.
	def := sandbox.DefaultConfig()
	c.MemoryFloorMiB = int64(cmp.Or(o.Sandbox.MemoryFloorMiB, def.MemoryFloorMiB))
	c.DefaultMemoryMiB = int64(cmp.Or(o.Sandbox.DefaultMemoryMiB, def.DefaultMemoryMiB))
	c.MaxMemoryMiB = int64(cmp.Or(o.Sandbox.MaxMemoryMiB, def.MaxMemoryMiB))
	c.MaxCPUs = cmp.Or(o.Sandbox.MaxCPUs, def.MaxCPUs)
	if o.Sandbox.MemoryOvercommit > 0 {
		c.MemoryLimitMiB = int64(o.Sandbox.MemoryOvercommit * float64(c.MemoryTotalMiB))
	}
	if c.MemAvailableMiB, err = hostinfo.MemAvailableMiB(); err != nil {
		errs = append(errs, err)
	}
	// What admission counts, with the ids of what it counts lately, at
	// one moment: placement stops counting what it sent once they show.
	a := st.Admissions(cluster.AdmitWindow)
	c.MemoryAdmittedMiB, c.MemoryStartingMiB = int64(a.CommittedMiB), int64(a.StartingMiB)
	c.Admits, c.Starting = a.Recent, a.Starting
	for _, s := range eng.Statuses() {
		if s.Available {
			c.Engines = append(c.Engines, s.Name)
		}
	}
	sbs, err := local.List(ctx)
	errs = append(errs, err)
	c.Sandboxes = len(sbs)
	for _, sb := range sbs {
		if sb.State == "running" {
			c.Running++
		}
	}
	imgs, err := local.ListImages(ctx)
	errs = append(errs, err)
	for _, im := range imgs {
		c.Images = append(c.Images, im.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("node capacity: %w", err)
	}
	return c, nil
}
