// Package local is service.Service over this process's lifecycle service
// (sandbox.Manager) and its volume, secret and image services: exactly a
// single node's behaviour. It is where the store's records become api
// types and where a front's call reaches the agent protocol and the engine.
package local

import (
	"context"
	"io"
	"net"
	"net/netip"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/hostmask"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/volume"
)

// Config is what the local service is made of.
type Config struct {
	// Version is the daemon's, reported by Health.
	Version string
	// EngineVersion is reported by Health, asked at each call (it may
	// change: QEMU's accelerator is picked at the first VM start).
	EngineVersion func() string
	// Engines lists the node's engines for Health.
	Engines []api.EngineStatus
	// Addr returns a running sandbox's own network address, if it has
	// one; nil when the node has no networking.
	Addr func(store.Sandbox) (netip.Addr, bool)
	// Volumes and Secrets are nil when the node has none.
	Volumes *volume.Manager
	Secrets *secret.Manager
}

// Service is the local service.Service.
type Service struct {
	cfg Config
	mgr *sandbox.Manager
	// stores serves the volumes and secrets (stores.go).
	stores
}

var _ service.Service = (*Service)(nil)
var _ service.ThroughWriter = (*Service)(nil)

// New returns the service over mgr.
func New(cfg Config, mgr *sandbox.Manager) *Service {
	return &Service{cfg: cfg, mgr: mgr, stores: stores{cfg: cfg}}
}

// statsParallel bounds the engine readings of one ListStats taken at once
// (a reading may start a process, e.g. `runsc ps`).
const statsParallel = 4

// toAPI is a sandbox's record as the API shows it, with what only the
// running node knows: a running sandbox's own address (a sleeping
// sandbox's slot is being given back). Ingress carries the traffic token
// only; the front that serves an ingress fills in its URL.
func (s *Service) toAPI(sb store.Sandbox) api.Sandbox {
	out := api.Sandbox{Node: sb.Node, ID: sb.ID, Name: sb.Name, Image: sb.Image, State: sb.State, MemoryMiB: sb.MemoryMiB,
		CPUs: sb.CPUs, Env: sb.Env, Snapshot: sb.Snapshot, DiskMiB: sb.Opts.DiskMiB, Engine: sb.Opts.Engine, Labels: sb.Opts.Labels, Error: sb.Error, CreatedAt: sb.CreatedAt.UTC(),
		Public: sb.Opts.Public, IdleSleepMS: sb.Opts.IdleSleepMS, TimeoutMS: sb.Opts.TimeoutMS, ExpiresAt: sb.Opts.ExpiresAt, OnTimeout: sb.Opts.OnTimeout,
		Volumes: volumeMountsToAPI(sb.Opts.Volumes), Secrets: secretRefsToAPI(sb.Opts.Secrets)}
	if n := sb.Opts.Network; n != nil {
		out.Network = &api.Network{Mode: n.Mode, Egress: n.Egress, Allow: n.Allow, Deny: n.Deny}
		if s.cfg.Addr != nil && sb.State == store.StateRunning {
			if addr, ok := s.cfg.Addr(sb); ok {
				out.Network.Address = addr.String()
			}
		}
	}
	if sb.Opts.TrafficToken != "" {
		out.Ingress = &api.Ingress{TrafficToken: sb.Opts.TrafficToken, HostMask: sb.Opts.HostMask}
	}
	return out
}

func volumeMountsFromAPI(vms []api.VolumeMount) []store.VolumeMount {
	var out []store.VolumeMount
	for _, vm := range vms {
		out = append(out, store.VolumeMount{Name: vm.Name, Path: vm.Path, ReadOnly: vm.ReadOnly, Shared: vm.Shared, Clone: vm.Clone})
	}
	return out
}

func volumeMountsToAPI(vms []store.VolumeMount) []api.VolumeMount {
	var out []api.VolumeMount
	for _, vm := range vms {
		out = append(out, api.VolumeMount{Name: vm.Name, Path: vm.Path, ReadOnly: vm.ReadOnly, Shared: vm.Shared, Clone: vm.Clone})
	}
	return out
}

func secretRefsFromAPI(refs []api.SecretRef) []store.SecretRef {
	var out []store.SecretRef
	for _, r := range refs {
		out = append(out, store.SecretRef{Name: r.Name, Env: r.Env, File: r.File})
	}
	return out
}

func secretRefsToAPI(refs []store.SecretRef) []api.SecretRef {
	var out []api.SecretRef
	for _, r := range refs {
		out = append(out, api.SecretRef{Name: r.Name, Env: r.Env, File: r.File, Version: r.Version})
	}
	return out
}

func (s *Service) sandboxes(sbs []store.Sandbox) []api.Sandbox {
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, s.toAPI(sb))
	}
	return out
}

func (s *Service) one(sb store.Sandbox, err error) (api.Sandbox, error) {
	if err != nil {
		return api.Sandbox{}, err
	}
	return s.toAPI(sb), nil
}

// Sandboxes.

func (s *Service) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	if req.Node != "" {
		return api.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "node %q: this daemon is not a node of a cluster (start it with --cluster)", req.Node)
	}
	creq := sandbox.CreateRequest{Name: req.Name, Image: req.Image, MemoryMiB: req.MemoryMiB, CPUs: req.CPUs, Env: req.Env, FromSnapshot: req.FromSnapshot,
		Opts: store.Options{DiskMiB: req.DiskMiB, Engine: req.Engine, Labels: req.Labels,
			Public: req.Public, HostMask: req.HostMask, IdleSleepMS: req.IdleSleepMS, TimeoutMS: req.TimeoutMS, OnTimeout: req.OnTimeout,
			Volumes: volumeMountsFromAPI(req.Volumes), Secrets: secretRefsFromAPI(req.Secrets)}}
	if n := req.Network; n != nil {
		creq.Opts.Network = &store.NetworkOptions{Mode: n.Mode, Egress: n.Egress, Allow: n.Allow, Deny: n.Deny}
	}
	if req.HostMask != "" {
		if err := hostmask.Check(req.HostMask); err != nil {
			return api.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "host_mask: %v", err)
		}
	}
	return s.one(s.mgr.Create(ctx, creq))
}

func (s *Service) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	return s.one(s.mgr.Get(ctx, ref))
}

func (s *Service) List(ctx context.Context) ([]api.Sandbox, error) {
	sbs, err := s.mgr.List(ctx)
	if err != nil {
		return nil, err
	}
	return s.sandboxes(sbs), nil
}

func (s *Service) Remove(ctx context.Context, ref string) error { return s.mgr.Destroy(ctx, ref) }

func (s *Service) RemoveAbandoned(ctx context.Context, why string, ids ...string) {
	s.mgr.RemoveAbandoned(ctx, why, ids...)
}

func (s *Service) Sleep(ctx context.Context, ref string) (api.Sandbox, error) {
	return s.one(s.mgr.Sleep(ctx, ref))
}

func (s *Service) SleepFiles(ctx context.Context, ref string) (api.Sandbox, error) {
	return s.one(s.mgr.SleepFiles(ctx, ref))
}

func (s *Service) Wake(ctx context.Context, ref string) (api.Sandbox, error) {
	return s.one(s.mgr.Wake(ctx, ref))
}

func (s *Service) SetTimeout(ctx context.Context, ref string, req api.TimeoutRequest) (api.Sandbox, error) {
	if req.TimeoutMS < 0 || req.TimeoutMS > int64(366*24*time.Hour/time.Millisecond) {
		return api.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "timeout_ms %d is out of range: give 0 to remove the timeout, or 1 ms to 366 days", req.TimeoutMS)
	}
	return s.one(s.mgr.Lifetimes().SetTimeout(ctx, ref, time.Duration(req.TimeoutMS)*time.Millisecond, req.OnTimeout))
}

// Snapshots.

func snapshotToAPI(sn store.Snapshot, users []string) api.Snapshot {
	return api.Snapshot{ID: sn.ID, Name: sn.Name, Node: sn.Node, Sandbox: sn.Sandbox, Image: sn.Image, MemoryMiB: sn.MemoryMiB, CPUs: sn.CPUs,
		SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC(), Implicit: sn.Implicit, UsedBy: users}
}

func (s *Service) Snapshot(ctx context.Context, ref, name string) (api.Snapshot, error) {
	sn, err := s.mgr.Snapshot(ctx, ref, name, false)
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotToAPI(sn, nil), nil
}

func (s *Service) Fork(ctx context.Context, source string, n int) (api.ForkResult, error) {
	if source == "" {
		return api.ForkResult{}, errdefs.New(errdefs.InvalidArgument, "source is empty: name a snapshot or a running sandbox")
	}
	res, err := s.mgr.Fork(ctx, source, n)
	if err != nil {
		return api.ForkResult{}, err
	}
	return ForkResult(res), nil
}

// ForkResult is the API's form of a fork's result: each child's id, or
// its error and the error's class.
func ForkResult(res sandbox.ForkResult) api.ForkResult {
	out := api.ForkResult{Snapshot: res.Snapshot, Children: make([]api.ForkChild, len(res.Children))}
	for i, c := range res.Children {
		out.Children[i] = api.ForkChild{ID: c.ID}
		if c.Err != nil {
			out.Children[i] = api.ForkChild{Error: c.Err.Error(), Code: string(errdefs.ClassOf(c.Err))}
		}
	}
	return out
}

func (s *Service) GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	sn, users, err := s.mgr.GetSnapshot(ctx, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotToAPI(sn, users), nil
}

func (s *Service) ListSnapshots(ctx context.Context) ([]api.Snapshot, error) {
	snaps, err := s.mgr.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Snapshot, 0, len(snaps))
	for _, sn := range snaps {
		if sn.State != store.SnapshotReady {
			continue
		}
		_, users, err := s.mgr.GetSnapshot(ctx, sn.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, snapshotToAPI(sn, users))
	}
	return out, nil
}

func (s *Service) RemoveSnapshot(ctx context.Context, ref string) error {
	return s.mgr.DeleteSnapshot(ctx, ref)
}

// callHook, set by tests only, is called by onGuest between a call's
// lookup of its sandbox's agent connection and its call on it
// ("looked-up"), and when the connection refused the call for a sleep
// that took the sandbox in between ("refused").
var callHook func(point, ref string)

// onGuest runs op on the agent connection of ref's sandbox (woken first
// with wake). A call that the connection refused unstarted because a
// sleep took the sandbox after the lookup (guest.IsRetired: the call came
// later than the idle sleeps' lookup grace, or the sleep was asked for)
// does not fail for it: the sandbox is looked up again, which waits for
// the sleep and wakes it (or, without wake, finds it asleep: Conflict),
// and op runs on it. op must not have consumed anything of its request
// before its call opened (the guest package's calls do not).
func onGuest[T any](ctx context.Context, s *Service, ref string, wake service.WakeMode, op func(*guest.Conn) (T, error)) (T, error) {
	for tries := 1; ; tries++ {
		g, err := s.guest(ctx, ref, wake)
		if err != nil {
			var zero T
			return zero, err
		}
		if callHook != nil {
			callHook("looked-up", ref)
		}
		v, err := op(g)
		if !guest.IsRetired(err) || tries == retiredTries {
			return v, err
		}
		if callHook != nil {
			callHook("refused", ref)
		}
	}
}

// retiredTries bounds the tries of a call refused by a sleep each time:
// each try after the first waits for a whole sleep and wake.
const retiredTries = 5

// guest is the agent connection of ref's sandbox, woken first with wake;
// without, a sandbox that is not running is a Conflict (and one that a
// sleep puts to sleep meanwhile is not woken).
func (s *Service) guest(ctx context.Context, ref string, wake service.WakeMode) (*guest.Conn, error) {
	if wake {
		return s.mgr.GuestWaking(ctx, ref)
	}
	sb, err := s.mgr.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.State != store.StateRunning {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running (wake it first)", sb.ID, sb.State)
	}
	return s.mgr.Guest(ctx, sb.ID)
}

// Exec.

func (s *Service) Exec(ctx context.Context, ref string, wake service.WakeMode, req api.ExecRequest) (service.Process, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "cmd is empty: give the command and its arguments")
	}
	if err := guest.CheckArgv(req.Cmd); err != nil {
		return nil, err
	}
	if err := guest.CheckEnv(req.Env); err != nil {
		return nil, err
	}
	if req.Workdir != "" && !path.IsAbs(req.Workdir) {
		return nil, errdefs.New(errdefs.InvalidArgument, "workdir %q must be an absolute path", req.Workdir)
	}
	timeout, err := guest.TimeoutFromMS(req.TimeoutMS)
	if err != nil {
		return nil, err
	}
	if !req.TTY && (req.Rows != 0 || req.Cols != 0) {
		return nil, errdefs.New(errdefs.InvalidArgument, "rows and cols are a terminal's size: set tty too, or leave them out")
	}
	if (req.Rows == 0) != (req.Cols == 0) {
		return nil, errdefs.New(errdefs.InvalidArgument, "terminal size %dx%d: give both rows and cols, or neither (24x80)", req.Rows, req.Cols)
	}
	greq := guest.ExecRequest{Argv: req.Cmd, Env: req.Env, Dir: req.Workdir, Timeout: timeout, Stdin: req.Stdin,
		TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, User: req.User, Keep: req.Keep, Tag: req.Tag}
	p, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (*guest.Process, error) { return g.Exec(ctx, greq) })
	if err != nil {
		return nil, err
	}
	return process{p}, nil
}

func (s *Service) SupportsUser(ctx context.Context, ref string, wake service.WakeMode) (bool, error) {
	g, err := s.guest(ctx, ref, wake)
	if err != nil {
		return false, err
	}
	return g.SupportsUser(ctx), nil
}

func (s *Service) Kept(ctx context.Context, ref string, wake service.WakeMode) ([]api.KeptCommand, error) {
	kept, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) ([]guest.KeptCommand, error) { return g.Kept(ctx) })
	if err != nil {
		return nil, err
	}
	out := make([]api.KeptCommand, 0, len(kept))
	for _, k := range kept {
		c := api.KeptCommand{PID: k.PID, Cmd: k.Argv, Tag: k.Tag, Started: time.UnixMilli(k.StartedMS).UTC(),
			Stdin: k.Stdin, Attached: k.Attached}
		if k.Ended && k.Exit != nil {
			e := k.Exit
			c.Exit = &api.ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, Error: e.Error, ErrorClass: e.ErrorClass}
		}
		out = append(out, c)
	}
	return out, nil
}

func (s *Service) Attach(ctx context.Context, ref string, wake service.WakeMode, pid int, stdin bool) (service.Process, error) {
	p, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (*guest.Process, error) { return g.Attach(ctx, pid, stdin) })
	if err != nil {
		return nil, err
	}
	return process{p}, nil
}

type process struct{ p *guest.Process }

func (p process) PID() int { return p.p.PID() }

func (p process) Stdin() io.WriteCloser {
	if p.p.Stdin == nil {
		return nil
	}
	return p.p.Stdin
}
func (p process) Stdout() io.Reader               { return p.p.Stdout }
func (p process) Stderr() io.Reader               { return p.p.Stderr }
func (p process) Signal(sig syscall.Signal) error { return p.p.Signal(sig) }
func (p process) Resize(rows, cols uint16) error  { return p.p.Resize(rows, cols) }
func (p process) Close()                          { p.p.Close() }
func (p process) Wait(ctx context.Context) (api.ExitStatus, error) {
	exit, err := p.p.Wait(ctx)
	if err != nil {
		return api.ExitStatus{}, err
	}
	return api.ExitStatus{Code: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut, Error: exit.Error, ErrorClass: string(exit.ErrorClass)}, nil
}

// Files.

func (s *Service) Stat(ctx context.Context, ref string, wake service.WakeMode, p string) (service.FileInfo, error) {
	fi, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (guest.FileInfo, error) { return g.Stat(ctx, p) })
	if err != nil {
		return service.FileInfo{}, err
	}
	return service.FileInfo{IsDir: fi.IsDir}, nil
}

func (s *Service) Watch(ctx context.Context, ref string, wake service.WakeMode, p string, recursive bool) (service.Watcher, error) {
	w, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (*guest.Watch, error) { return g.Watch(ctx, p, recursive) })
	if err != nil {
		return nil, err
	}
	return watcher{w}, nil
}

func (s *Service) Xattrs(ctx context.Context, ref string, wake service.WakeMode, prefix string, paths []string) ([]map[string]string, error) {
	return onGuest(ctx, s, ref, wake, func(g *guest.Conn) ([]map[string]string, error) { return g.Xattrs(ctx, prefix, paths) })
}

func (s *Service) SetXattrs(ctx context.Context, ref string, wake service.WakeMode, p, prefix string, attrs map[string]string) error {
	_, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (struct{}, error) { return struct{}{}, g.SetXattrs(ctx, p, prefix, attrs) })
	return err
}

type watcher struct{ w *guest.Watch }

func (w watcher) Next() (service.WatchEvent, error) {
	ev, err := w.w.Next()
	return service.WatchEvent{Op: ev.Op, Name: ev.Name}, err
}

func (w watcher) Close() { w.w.Close() }

func (s *Service) CopyOut(ctx context.Context, ref string, wake service.WakeMode, p string) (io.ReadCloser, error) {
	return onGuest(ctx, s, ref, wake, func(g *guest.Conn) (io.ReadCloser, error) {
		if _, err := g.Stat(ctx, p); err != nil {
			if errdefs.IsNotFound(err) {
				return nil, errdefs.New(errdefs.NotFound, "%s: no such file or directory in sandbox %s", p, ref)
			}
			return nil, err
		}
		return g.CopyOut(ctx, p, nil)
	})
}

func (s *Service) CopyIn(ctx context.Context, ref string, wake service.WakeMode, p, user string, r io.Reader) error {
	_, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (struct{}, error) { return struct{}{}, g.CopyInAs(ctx, p, user, r) })
	return err
}

func (s *Service) WriteThrough(ctx context.Context, ref string, wake service.WakeMode, dir, user string, r io.Reader) error {
	_, err := onGuest(ctx, s, ref, wake, func(g *guest.Conn) (struct{}, error) { return struct{}{}, g.CopyInThrough(ctx, dir, user, r) })
	return err
}

// Traffic.

func (s *Service) Dial(ctx context.Context, ref string, wake service.WakeMode, port int) (net.Conn, error) {
	if wake {
		return s.mgr.Traffic().DialWaking(ctx, ref, port)
	}
	if _, err := s.guest(ctx, ref, wake); err != nil {
		return nil, err
	}
	return s.mgr.Traffic().Dial(ctx, ref, port)
}

func (s *Service) Ready(ctx context.Context, ref string, wake service.WakeMode) (any, error) {
	g, err := s.guest(ctx, ref, wake)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (s *Service) Hold(id string) (release func()) { return s.mgr.Traffic().Hold(id) }

func (s *Service) Running(id string) bool { return s.mgr.Traffic().Running(id) }

// Events.

func apiEvent(e events.Event) api.Event {
	out := api.Event{Seq: e.Seq, Time: e.Time, Type: string(e.Type), Sandbox: e.Sandbox, Name: e.Name, Labels: e.Labels,
		Snapshot: e.Snapshot, Children: e.Children, Failed: e.Failed, Reason: e.Reason}
	if x := e.Exec; x != nil {
		out.Exec = &api.EventExec{Cmd: x.Cmd, TTY: x.TTY, PID: x.PID, Code: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, Error: x.Error}
	}
	return out
}

func apiEvents(evs []events.Event) []api.Event {
	out := make([]api.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, apiEvent(e))
	}
	return out
}

func (s *Service) EventsSince(ctx context.Context, since uint64, f service.EventFilter) ([]api.Event, error) {
	evs, err := s.mgr.Events().Since(since, events.Filter{Sandbox: f.Sandbox, Labels: f.Labels})
	if err != nil {
		return nil, err
	}
	return apiEvents(evs), nil
}

func (s *Service) SubscribeEvents(ctx context.Context, since uint64, hasSince bool, f service.EventFilter) (service.Subscription, error) {
	backlog, sub, err := s.mgr.Events().Subscribe(since, hasSince, events.Filter{Sandbox: f.Sandbox, Labels: f.Labels})
	if err != nil {
		return nil, err
	}
	out := &subscription{sub: sub, backlog: apiEvents(backlog), c: make(chan api.Event, cap(sub.C())), done: make(chan struct{}), stop: make(chan struct{})}
	go out.run()
	return out, nil
}

// subscription turns a bus subscription's events into api events. Its
// own channel is as deep as the bus's, so that a slow client is ended by
// the bus, as before, not held up here.
type subscription struct {
	sub     *events.Subscription
	backlog []api.Event
	c       chan api.Event
	done    chan struct{}
	stop    chan struct{}
	once    sync.Once
}

func (s *subscription) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case e := <-s.sub.C():
			select {
			case s.c <- apiEvent(e):
			case <-s.stop:
				return
			}
		case <-s.sub.Done():
			for n := len(s.sub.C()); n > 0; n-- {
				select {
				case s.c <- apiEvent(<-s.sub.C()):
				case <-s.stop:
					return
				}
			}
			return
		}
	}
}

func (s *subscription) Start() uint64         { return s.sub.Start }
func (s *subscription) Backlog() []api.Event  { return s.backlog }
func (s *subscription) C() <-chan api.Event   { return s.c }
func (s *subscription) Done() <-chan struct{} { return s.done }
func (s *subscription) Err() error {
	if err := s.sub.Err(); err != nil {
		return err
	}
	return errdefs.New(errdefs.Unavailable, "the event stream was closed")
}
func (s *subscription) Close() {
	s.once.Do(func() { close(s.stop); s.sub.Close() })
}

// Stats.

func (s *Service) Stats(ctx context.Context, ref string) (api.SandboxStats, error) {
	if !service.PidsWanted(ctx) {
		ctx = engine.WithoutPids(ctx)
	}
	sb, err := s.mgr.Get(ctx, ref)
	if err != nil {
		return api.SandboxStats{}, err
	}
	return s.readStats(ctx, sb)
}

func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (s *Service) ListStats(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error) {
	var sbs []store.Sandbox
	if len(refs) > 0 {
		for _, ref := range refs {
			sb, err := s.mgr.Get(ctx, ref)
			if err != nil {
				return nil, err
			}
			sbs = append(sbs, sb)
		}
	} else {
		all, err := s.mgr.List(ctx)
		if err != nil {
			return nil, err
		}
		for _, sb := range all {
			if hasLabels(sb.Opts.Labels, labels) {
				sbs = append(sbs, sb)
			}
		}
	}
	out := make([]api.SandboxStats, len(sbs))
	errs := make([]error, len(sbs))
	sem := make(chan struct{}, statsParallel)
	var wg sync.WaitGroup
	for i, sb := range sbs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = s.readStats(ctx, sb)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readStats reads sb's use from the engine. A sandbox that is not running,
// or that stops while it is read, gets a reading with no use.
func (s *Service) readStats(ctx context.Context, sb store.Sandbox) (api.SandboxStats, error) {
	out := api.SandboxStats{ID: sb.ID, Name: sb.Name, State: sb.State, CPUs: sb.CPUs,
		MemoryLimitBytes: uint64(sb.MemoryMiB) << 20, ReadAt: time.Now().UTC()}
	statser, ok := s.mgr.Engine().(engine.Statser)
	if !ok {
		return out, errdefs.New(errdefs.Unavailable, "the %s engine cannot read sandboxes' resource use", s.mgr.Engine().Name())
	}
	if sb.State != store.StateRunning {
		return out, nil
	}
	st, err := statser.Stats(ctx, sb.Engine())
	switch {
	case errdefs.ClassOf(err) == errdefs.NotFound:
		return out, nil
	case err != nil:
		return out, err
	}
	out.CPUNanos, out.MemoryBytes, out.Pids = st.CPUNanos, st.MemoryBytes, st.Pids
	if st.MemoryLimitBytes > 0 {
		out.MemoryLimitBytes = st.MemoryLimitBytes
	}
	out.ReadAt = time.Now().UTC()
	return out, nil
}

// Images.

func imageToAPI(img image.Image, users []string) api.Image {
	out := api.Image{Name: img.Name, Ref: image.FamiliarRef(img.Ref), Source: img.Source, SizeBytes: img.SizeBytes, CreatedAt: img.CreatedAt,
		Platform: img.Platform, ManifestDigest: img.ManifestDigest, Layers: img.Layers, UsedBy: users, Snapshot: img.Snapshot}
	c := img.Config
	if len(c.Env) > 0 || c.WorkingDir != "" || c.User != "" || len(c.Entrypoint) > 0 || len(c.Cmd) > 0 {
		out.Config = &api.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	}
	return out
}

func (s *Service) ListImages(ctx context.Context) ([]api.Image, error) {
	imgs, err := s.mgr.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, imageToAPI(img, nil))
	}
	return out, nil
}

func (s *Service) Image(ctx context.Context, ref string) (api.Image, error) {
	if !service.UsersWanted(ctx) {
		img, err := s.mgr.Images().Find(ctx, ref)
		if err != nil {
			return api.Image{}, err
		}
		return imageToAPI(img, nil), nil
	}
	img, users, err := s.mgr.Images().Inspect(ctx, ref)
	if err != nil {
		return api.Image{}, err
	}
	return imageToAPI(img, users), nil
}

func (s *Service) RemoveImage(ctx context.Context, ref string) error {
	return s.mgr.Images().Remove(ctx, ref)
}

func progressOf(f func(api.ImageProgress)) func(image.Progress) {
	if f == nil {
		return nil
	}
	return func(p image.Progress) {
		f(api.ImageProgress{Layer: p.Layer, LayersDone: p.LayersDone, LayersTotal: p.LayersTotal,
			BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, Cached: p.Cached})
	}
}

func (s *Service) PullImage(ctx context.Context, req api.PullImageRequest, progress func(api.ImageProgress)) (api.Image, error) {
	if req.Ref == "" {
		return api.Image{}, errdefs.New(errdefs.InvalidArgument, "ref is empty: name an image, e.g. python:3.12-slim")
	}
	img, err := s.mgr.Images().Pull(ctx, req.Ref, image.PullOptions{Name: req.Name, Platform: req.Platform, Insecure: req.Insecure, Progress: progressOf(progress)})
	if err != nil {
		return api.Image{}, err
	}
	return imageToAPI(img, nil), nil
}

func (s *Service) ImportImage(ctx context.Context, path string, opts service.ImportImage, progress func(api.ImageProgress)) (api.Image, error) {
	img, err := s.mgr.Images().Import(ctx, path, image.ImportOptions{Name: opts.Name, Source: opts.Source, Progress: progressOf(progress)})
	if err != nil {
		return api.Image{}, err
	}
	return imageToAPI(img, nil), nil
}

func (s *Service) CheckDisk(op string) error { return s.mgr.CheckDisk(op) }

// Builds.

func (s *Service) CreateBuildSandbox(ctx context.Context, req api.BuildSandboxRequest) (api.Sandbox, error) {
	return s.one(s.mgr.Builds().CreateSandbox(ctx, sandbox.CreateRequest{Image: req.From, Env: req.Env}))
}

func (s *Service) EndBuild(ctx context.Context, id string) error { return s.mgr.Builds().End(ctx, id) }

func (s *Service) Commit(ctx context.Context, ref string, req api.CommitRequest) (api.Image, error) {
	img, err := s.mgr.Builds().Commit(ctx, ref, sandbox.CommitRequest{Name: req.Name, Env: req.Env, Workdir: req.Workdir,
		Start: req.Start, Ready: req.Ready, ReadyTimeout: time.Duration(req.ReadyTimeoutMS) * time.Millisecond, Volumes: volumeMountsFromAPI(req.Volumes)})
	if err != nil {
		return api.Image{}, err
	}
	return imageToAPI(img, nil), nil
}

// Networks.

func (s *Service) SetNetwork(ctx context.Context, ref string, n api.Network) (api.Sandbox, error) {
	return s.one(s.mgr.SetNetwork(ctx, ref, store.NetworkOptions{Mode: n.Mode, Egress: n.Egress, Allow: n.Allow, Deny: n.Deny}))
}

func (s *Service) ChangeNetwork(ctx context.Context, ref string, req api.NetworkChange) (api.Sandbox, error) {
	e := network.PolicyEdit{Egress: req.Egress, AddAllow: req.AddAllow, RemoveAllow: req.RemoveAllow, AddDeny: req.AddDeny, RemoveDeny: req.RemoveDeny}
	return s.one(s.mgr.EditNetwork(ctx, ref, func(cur store.NetworkOptions) (store.NetworkOptions, error) {
		p, err := network.Policy{Egress: cur.Egress, Allow: cur.Allow, Deny: cur.Deny}.Edit(e)
		return store.NetworkOptions{Mode: cur.Mode, Egress: p.Egress, Allow: p.Allow, Deny: p.Deny}, err
	}))
}

// Health.

func (s *Service) Health(ctx context.Context) (api.Health, error) {
	h := api.Health{Version: s.cfg.Version, Engine: s.mgr.Engine().Name(), Warm: s.mgr.Pools().Warm(), Hot: s.mgr.Pools().Hot(), Engines: s.cfg.Engines}
	if s.cfg.EngineVersion != nil {
		h.EngineVersion = s.cfg.EngineVersion()
	}
	return h, nil
}
