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
// API (service/remote, with the cluster token). Calls that are not on one
// sandbox (images, volumes, secrets, snapshots, events) are the node's own.
type Service struct {
	service.Service
	c *Cluster

	mu      sync.Mutex
	remotes map[string]*remote.Service // by address; guarded by mu
}

var (
	_ service.Service = (*Service)(nil)
	_ service.Nodes   = (*Service)(nil)
)

// NewService wraps local, the node's own service, for the cluster c.
func NewService(c *Cluster, local service.Service) *Service {
	return &Service{Service: local, c: c, remotes: map[string]*remote.Service{}}
}

// Nodes reads the cluster's live nodes.
func (s *Service) Nodes(ctx context.Context) ([]api.Node, error) { return s.c.Nodes(ctx) }

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
	// A full pass now and then mends what a write etcd refused missed.
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.Done():
			return sub.Err()
		case <-t.C:
			if err := s.resync(ctx); err != nil {
				s.c.cfg.Log.Warn("cluster: write the directory", "err", err)
			}
		case ev := <-sub.C():
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
		return s.c.Unpublish(ctx, id)
	}
	if err != nil {
		return err
	}
	return s.c.Publish(ctx, sb)
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
		if err := s.c.Publish(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range recs {
		if r.Node == s.c.cfg.Node && !have[r.ID] {
			errs = append(errs, s.c.Unpublish(ctx, r.ID))
		}
	}
	return errors.Join(errs...)
}

// Create checks the name cluster-wide, makes the sandbox on this node and
// writes its record before it answers: any node finds it from then on.
func (s *Service) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
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
	if err := s.c.Publish(ctx, sb); err != nil {
		s.c.cfg.Log.Warn("cluster: write a new sandbox's record", "sandbox", sb.ID, "err", err)
	}
	return sb, nil
}

// List is the node's sandboxes and, from the directory, the other live
// nodes' (without what stays on their node: environment, traffic token).
func (s *Service) List(ctx context.Context) ([]api.Sandbox, error) {
	own, err := s.Service.List(ctx)
	if err != nil {
		return nil, err
	}
	for i := range own {
		own[i].Node = s.c.cfg.Node
	}
	recs, err := s.c.Records(ctx)
	if err != nil {
		s.c.cfg.Log.Warn("cluster: list without the other nodes", "err", err)
		return own, nil
	}
	for _, r := range recs {
		if r.Node != s.c.cfg.Node {
			sb := r.Sandbox
			sb.ID, sb.Node, sb.State, sb.Name = r.ID, r.Node, r.State, r.Name
			own = append(own, sb)
		}
	}
	slices.SortStableFunc(own, func(a, b api.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return own, nil
}

// route picks the service that holds ref: this node's when it has it,
// else the node the directory names.
func (s *Service) route(ctx context.Context, ref string) (service.Service, error) {
	if s.Service.Running(ref) {
		return s.Service, nil
	}
	if _, err := s.Service.Get(ctx, ref); err == nil || !errdefs.IsNotFound(err) {
		return s.Service, nil // here, or an error of this node's to tell
	}
	rec, ok, err := s.c.Lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !ok || rec.Node == s.c.cfg.Node {
		return s.Service, nil // the node's own NotFound
	}
	n, live, err := s.c.node(ctx, rec.Node)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s is on node %s, which is not in the cluster now (its lease lapsed): try again when it is back", rec.ID, rec.Node)
	}
	return s.remote(n)
}

func (s *Service) remote(n api.Node) (*remote.Service, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.remotes[n.Addr]; ok {
		return r, nil
	}
	host := n.Addr
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	c, err := sdk.New(host, sdk.WithToken(s.c.cfg.Token))
	if err != nil {
		return nil, errdefs.New(errdefs.Unavailable, "node %s's address %q: %v", n.Name, n.Addr, err)
	}
	r := remote.New(c, n.Name)
	s.remotes[n.Addr] = r
	return r, nil
}

func (s *Service) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := svc.Get(ctx, ref)
	if err == nil && svc == s.Service {
		sb.Node = s.c.cfg.Node
	}
	return sb, err
}

// Remove removes the sandbox where it is; this node drops the record of
// one it held at once (the holder of another does).
func (s *Service) Remove(ctx context.Context, ref string) error {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return err
	}
	if svc != s.Service {
		return svc.Remove(ctx, ref)
	}
	sb, err := s.Service.Get(ctx, ref)
	if err != nil {
		return err
	}
	if err := s.Service.Remove(ctx, ref); err != nil {
		return err
	}
	if err := s.c.Unpublish(ctx, sb.ID); err != nil {
		s.c.cfg.Log.Warn("cluster: remove a sandbox's record", "sandbox", sb.ID, "err", err)
	}
	return nil
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
	svc, err := s.route(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return svc.Wake(ctx, ref)
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

func (s *Service) Dial(ctx context.Context, ref string, wake service.WakeMode, port int) (net.Conn, error) {
	svc, err := s.route(ctx, ref)
	if err != nil {
		return nil, err
	}
	return svc.Dial(ctx, ref, wake, port)
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
