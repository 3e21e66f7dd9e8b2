// Package remote is service.Service over the SDK: another node's daemon,
// reached over its API. A cluster node uses it to serve a call on a
// sandbox another node holds; the fronts cannot tell it from the local
// service (service/servicetest runs both).
//
// Where the API has no call of its own, the remote does what the API
// allows and says so:
//   - NoWake calls read the sandbox first and refuse one that is not
//     running, then make the call; a sandbox that goes to sleep in
//     between is woken by the remote node (the local service has the same
//     window).
//   - Stat reads the first entry of the path's tar stream and closes it.
//   - Hold marks nothing here: the remote node holds a sandbox busy for the
//     exec, file or port stream its own API serves.
//   - SupportsUser answers true: the API does not tell an old agent (the
//     remote node refuses what it cannot run as a user).
//   - Running answers false (it cannot tell without a call); Ready asks.
//   - CheckDisk answers nil: the remote node checks its own disk as it
//     reads an upload.
//   - Watch is not supported: the API has no directory watch (an
//     InvalidArgument error says so).
//   - Exec with Keep or Tag, Kept and Attach go to the node's peer-only
//     routes under /v1/internal/: the client must hold the cluster token
//     (any other caller gets Unauthenticated). An attach's Close detaches.
//   - A subscription's Start is the since it was asked for (the remote's
//     own start is not in the SDK's stream); its backlog comes through C.
package remote

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/sdk"
)

// Service is a remote node's service.Service.
type Service struct {
	c    *sdk.Client
	node string // for messages

	mu     sync.Mutex
	builds map[string]func() // build sandbox id -> end of its lease; guarded by mu
}

var _ service.Service = (*Service)(nil)

// New returns the service of the node c reaches; node names it in
// errors.
func New(c *sdk.Client, node string) *Service {
	return &Service{c: c, node: node, builds: map[string]func(){}}
}

// classify gives an SDK error its errdefs class, so that a front answers a
// remote node's refusal as it would its own; a node that cannot be
// reached is Unavailable (retryable).
func classify(err error) error {
	if err == nil {
		return nil
	}
	var de *sdk.Error
	if errors.As(err, &de) {
		switch c := errdefs.Class(de.Code); c {
		case errdefs.NotFound, errdefs.AlreadyExists, errdefs.InvalidArgument, errdefs.Conflict,
			errdefs.Unavailable, errdefs.ResourceExhausted, errdefs.Unauthenticated:
			return errdefs.Wrap(c, err)
		}
		return err
	}
	var ce *sdk.ConnectError
	if errors.As(err, &ce) {
		return errdefs.Wrap(errdefs.Unavailable, err)
	}
	return err
}

func one[T any](v T, err error) (T, error) { return v, classify(err) }

// running refuses a sandbox that is not running, for a NoWake call, and
// returns its id.
func (s *Service) running(ctx context.Context, ref string, wake service.WakeMode) (string, error) {
	if wake {
		return ref, nil
	}
	sb, err := s.c.GetSandbox(ctx, ref)
	if err != nil {
		return "", classify(err)
	}
	if sb.State != "running" {
		return "", errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running (wake it first)", sb.ID, sb.State)
	}
	return sb.ID, nil
}

// Sandboxes.

func (s *Service) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return one(s.c.CreateSandbox(ctx, req))
}

func (s *Service) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	return one(s.c.GetSandbox(ctx, ref))
}

func (s *Service) List(ctx context.Context) ([]api.Sandbox, error) {
	return one(s.c.ListSandboxes(ctx))
}

func (s *Service) Remove(ctx context.Context, ref string) error {
	return classify(s.c.DeleteSandbox(ctx, ref))
}

func (s *Service) RemoveAbandoned(ctx context.Context, why string, ids ...string) {
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		_ = s.c.DeleteSandbox(ctx, id)
	}
}

func (s *Service) Sleep(ctx context.Context, ref string) (api.Sandbox, error) {
	return one(s.c.Sleep(ctx, ref))
}

func (s *Service) SleepFiles(ctx context.Context, ref string) (api.Sandbox, error) {
	return one(s.c.SleepFiles(ctx, ref))
}

func (s *Service) Wake(ctx context.Context, ref string) (api.Sandbox, error) {
	return one(s.c.Wake(ctx, ref))
}

func (s *Service) SetTimeout(ctx context.Context, ref string, req api.TimeoutRequest) (api.Sandbox, error) {
	return one(s.c.SetTimeout(ctx, ref, time.Duration(req.TimeoutMS)*time.Millisecond, req.OnTimeout))
}

// Snapshots.

func (s *Service) Snapshot(ctx context.Context, ref, name string) (api.Snapshot, error) {
	return one(s.c.SnapshotSandbox(ctx, ref, name))
}

func (s *Service) Fork(ctx context.Context, source string, n int) (api.ForkResult, error) {
	return one(s.c.Fork(ctx, source, n))
}

// ForkAcross is Fork with the request's options (spread).
func (s *Service) ForkAcross(ctx context.Context, req api.ForkRequest) (api.ForkResult, error) {
	var opts []sdk.ForkOption
	if req.Spread {
		opts = append(opts, sdk.Spread())
	}
	return one(s.c.Fork(ctx, req.Source, req.N, opts...))
}

func (s *Service) GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	return one(s.c.GetSnapshot(ctx, ref))
}

func (s *Service) ListSnapshots(ctx context.Context) ([]api.Snapshot, error) {
	return one(s.c.ListSnapshots(ctx))
}

func (s *Service) RemoveSnapshot(ctx context.Context, ref string) error {
	return classify(s.c.DeleteSnapshot(ctx, ref))
}

// Exec.

func (s *Service) Exec(ctx context.Context, ref string, wake service.WakeMode, req api.ExecRequest) (service.Process, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "cmd is empty: give the command and its arguments")
	}
	if req.TimeoutMS < 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "timeout_ms %d is negative", req.TimeoutMS)
	}
	if !req.TTY && (req.Rows != 0 || req.Cols != 0) {
		return nil, errdefs.New(errdefs.InvalidArgument, "rows and cols are a terminal's size: set tty too, or leave them out")
	}
	// A sandbox that is not there is refused here, not by Wait: the
	// local service does the same. Without wake, its state is checked
	// first; with wake, Exec waits for the command's start (or the
	// refusal) instead, saving a round trip to the node.
	id := ref
	if !wake {
		sb, err := s.c.GetSandbox(ctx, ref)
		if err != nil {
			return nil, classify(err)
		}
		if sb.State != "running" {
			return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running (wake it first)", sb.ID, sb.State)
		}
		id = sb.ID
	}
	sreq := sdk.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir, Timeout: time.Duration(req.TimeoutMS) * time.Millisecond,
		TTY: req.TTY, Size: sdk.WindowSize{Rows: req.Rows, Cols: req.Cols}, User: req.User, Keep: req.Keep, Tag: req.Tag}
	// A caller that only reads the output (service.Plain) gets a plain
	// request on one of the client's kept-alive connections, its frames
	// relayed as they come (startPlain); signals, stdin or a terminal
	// need a two-way stream, a connection of its own.
	if service.IsPlain(ctx) && !req.Stdin && !req.TTY {
		return s.startPlain(ctx, id, sreq)
	}
	p := s.start(ctx, sreq, true, req.Stdin, func(ctx context.Context, sreq sdk.ExecRequest) (api.ExitStatus, error) {
		return s.c.Exec(ctx, id, sreq)
	})
	if wake {
		return p.waitStarted(ctx)
	}
	return p, nil
}

// start runs call (an exec's or an attach's stream) for a process whose
// output, stdin, signals and terminal go through sreq.
func (s *Service) start(ctx context.Context, sreq sdk.ExecRequest, signals, stdin bool, call func(context.Context, sdk.ExecRequest) (api.ExitStatus, error)) *process {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &process{cancel: cancel, done: make(chan struct{}), started: make(chan struct{})}
	if signals {
		p.signals = make(chan os.Signal, 4)
		sreq.Signals = p.signals
	}
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	p.stdout, p.stderr = outR, errR
	sreq.Stdout, sreq.Stderr = outW, errW
	sreq.Started = func(pid int) { p.pid = pid; close(p.started) }
	var inR *io.PipeReader
	if stdin {
		var inW *io.PipeWriter
		inR, inW = io.Pipe()
		p.stdin, sreq.Stdin = inW, inR
	}
	if sreq.TTY {
		p.resizes = make(chan sdk.WindowSize, 4)
		sreq.Resizes = p.resizes
	}
	go func() {
		st, err := call(pctx, sreq)
		p.exit, p.err = st, classify(err)
		outW.CloseWithError(err)
		errW.CloseWithError(err)
		if inR != nil {
			inR.Close() // a writer of stdin is told it ended
		}
		close(p.done)
	}()
	return p
}

// waitStarted waits for p's start, or for the refusal of its request.
func (p *process) waitStarted(ctx context.Context) (service.Process, error) {
	select {
	case <-p.started:
	case <-p.done:
		if p.err != nil {
			return nil, p.err
		}
	case <-ctx.Done():
		p.Close()
		return nil, ctx.Err()
	}
	return p, nil
}

// SupportsUser answers true: the API does not say what a sandbox's agent
// speaks, and the remote node's agent refuses a user it cannot run as
// (an agent of an older clade) with an error of its own.
func (s *Service) SupportsUser(ctx context.Context, ref string, wake service.WakeMode) (bool, error) {
	if _, err := s.Ready(ctx, ref, wake); err != nil {
		return false, err
	}
	return true, nil
}

// Kept lists the kept commands through the remote node's peer-only
// route (the cluster token).
func (s *Service) Kept(ctx context.Context, ref string, wake service.WakeMode) ([]api.KeptCommand, error) {
	return one(s.c.Peer().KeptCommands(ctx, ref, bool(wake)))
}

// Attach follows a kept command through the remote node's peer-only
// route (the cluster token), on a two-way stream of its own; Close
// detaches. It returns once the remote node attached, or with its
// refusal (a pid it does not keep is NotFound).
func (s *Service) Attach(ctx context.Context, ref string, wake service.WakeMode, pid int, stdin bool) (service.Process, error) {
	if pid <= 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "pid %d: give the pid of a kept command", pid)
	}
	p := s.start(ctx, sdk.ExecRequest{}, true, stdin, func(ctx context.Context, sreq sdk.ExecRequest) (api.ExitStatus, error) {
		return s.c.Peer().Attach(ctx, ref, pid, bool(wake), sreq)
	})
	return p.waitStarted(ctx)
}

type process struct {
	cancel  context.CancelFunc
	stdin   *io.PipeWriter
	stdout  *io.PipeReader
	stderr  *io.PipeReader
	signals chan os.Signal
	resizes chan sdk.WindowSize

	started chan struct{} // closed once the Started frame came
	pid     int           // set before started closes

	done chan struct{}
	exit api.ExitStatus // set before done closes
	err  error
}

// PID waits for the Started frame, or for the end of a process that did
// not start (or of one on a node whose daemon sends no Started frame: 0).
func (p *process) PID() int {
	select {
	case <-p.started:
		return p.pid
	case <-p.done:
		select {
		case <-p.started:
			return p.pid
		default:
			return 0
		}
	}
}

func (p *process) Stdin() io.WriteCloser {
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}

func (p *process) Stdout() io.Reader { return p.stdout }
func (p *process) Stderr() io.Reader { return p.stderr }

func (p *process) Signal(sig syscall.Signal) error {
	if p.signals == nil {
		return errdefs.New(errdefs.InvalidArgument, "this exec was started for its output only (service.Plain): it takes no signals")
	}
	select {
	case p.signals <- sig:
		return nil
	case <-p.done:
		return errdefs.New(errdefs.Conflict, "the process has ended")
	}
}

func (p *process) Resize(rows, cols uint16) error {
	if p.resizes == nil {
		return errdefs.New(errdefs.InvalidArgument, "the process has no terminal to resize")
	}
	select {
	case p.resizes <- sdk.WindowSize{Rows: rows, Cols: cols}:
		return nil
	case <-p.done:
		return errdefs.New(errdefs.Conflict, "the process has ended")
	}
}

func (p *process) Wait(ctx context.Context) (api.ExitStatus, error) {
	select {
	case <-p.done:
		return p.exit, p.err
	case <-ctx.Done():
		return api.ExitStatus{}, ctx.Err()
	}
}

func (p *process) Close() {
	p.cancel()
	p.stdout.CloseWithError(io.ErrClosedPipe)
	p.stderr.CloseWithError(io.ErrClosedPipe)
	<-p.done
}

// Files.

func (s *Service) Stat(ctx context.Context, ref string, wake service.WakeMode, p string) (service.FileInfo, error) {
	id, err := s.running(ctx, ref, wake)
	if err != nil {
		return service.FileInfo{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rc, err := s.c.CopyFrom(ctx, id, p)
	if err != nil {
		return service.FileInfo{}, classify(err)
	}
	defer rc.Close()
	h, err := tar.NewReader(rc).Next()
	if err != nil {
		return service.FileInfo{}, fmt.Errorf("stat %s on node %s: %w", p, s.node, err)
	}
	return service.FileInfo{IsDir: h.Typeflag == tar.TypeDir}, nil
}

func (s *Service) CopyOut(ctx context.Context, ref string, wake service.WakeMode, p string) (io.ReadCloser, error) {
	id, err := s.running(ctx, ref, wake)
	if err != nil {
		return nil, err
	}
	return one(s.c.CopyFrom(ctx, id, p))
}

// Watch is not supported over the API, which has no directory watch.
func (s *Service) Watch(ctx context.Context, ref string, wake service.WakeMode, p string, recursive bool) (service.Watcher, error) {
	return nil, errdefs.New(errdefs.InvalidArgument, "watching a directory is not supported on a sandbox of another node (the HTTP API has no watch)")
}

// Xattrs is not supported over the API, which has no file attributes.
func (s *Service) Xattrs(ctx context.Context, ref string, wake service.WakeMode, prefix string, paths []string) ([]map[string]string, error) {
	return nil, errdefs.New(errdefs.InvalidArgument, "file attributes are not supported on a sandbox of another node (the HTTP API has none)")
}

// SetXattrs is not supported over the API, which has no file attributes.
func (s *Service) SetXattrs(ctx context.Context, ref string, wake service.WakeMode, p, prefix string, attrs map[string]string) error {
	return errdefs.New(errdefs.InvalidArgument, "file attributes are not supported on a sandbox of another node (the HTTP API has none)")
}

func (s *Service) CopyIn(ctx context.Context, ref string, wake service.WakeMode, p, user string, r io.Reader) error {
	id, err := s.running(ctx, ref, wake)
	if err != nil {
		return err
	}
	return classify(s.c.CopyToAs(ctx, id, p, user, r))
}

// Traffic.

func (s *Service) Dial(ctx context.Context, ref string, wake service.WakeMode, port int) (net.Conn, error) {
	id, err := s.running(ctx, ref, wake)
	if err != nil {
		return nil, err
	}
	return one(s.c.DialPort(ctx, id, port))
}

// life is a remote sandbox's: the remote node tells its lives apart on
// each dial, so one value per sandbox is enough here.
type life struct{ node, id string }

func (s *Service) Ready(ctx context.Context, ref string, wake service.WakeMode) (any, error) {
	sb, err := s.c.GetSandbox(ctx, ref)
	if err != nil {
		return nil, classify(err)
	}
	if sb.State != "running" {
		if !wake {
			return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running (wake it first)", sb.ID, sb.State)
		}
		if sb, err = s.c.Wake(ctx, sb.ID); err != nil {
			return nil, classify(err)
		}
	}
	return life{s.node, sb.ID}, nil
}

func (s *Service) Hold(id string) (release func()) { return func() {} }

func (s *Service) Running(id string) bool { return false }

// Events.

func (s *Service) EventsSince(ctx context.Context, since uint64, f service.EventFilter) ([]api.Event, error) {
	seq, err := s.c.Events(ctx, sdk.EventFilter{Sandbox: f.Sandbox, Labels: f.Labels, Since: since, Kept: since == 0})
	if err != nil {
		return nil, classify(err)
	}
	var out []api.Event
	for e, err := range seq {
		if err != nil {
			return nil, classify(err)
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Service) SubscribeEvents(ctx context.Context, since uint64, hasSince bool, f service.EventFilter) (service.Subscription, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	seq, err := s.c.Events(sctx, sdk.EventFilter{Sandbox: f.Sandbox, Labels: f.Labels, Follow: true, Since: since, Kept: hasSince && since == 0})
	if err != nil {
		cancel()
		return nil, classify(err)
	}
	sub := &subscription{start: since, cancel: cancel, c: make(chan api.Event, 64), done: make(chan struct{})}
	go func() {
		defer close(sub.done)
		for e, err := range seq {
			if err != nil {
				sub.err = classify(err)
				return
			}
			select {
			case sub.c <- e:
			case <-sctx.Done():
				return
			}
		}
	}()
	return sub, nil
}

type subscription struct {
	start  uint64
	cancel context.CancelFunc
	c      chan api.Event
	done   chan struct{}
	err    error // set before done closes
}

func (s *subscription) Start() uint64         { return s.start }
func (s *subscription) Backlog() []api.Event  { return nil }
func (s *subscription) C() <-chan api.Event   { return s.c }
func (s *subscription) Done() <-chan struct{} { return s.done }
func (s *subscription) Close()                { s.cancel(); <-s.done }
func (s *subscription) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Stats.

func (s *Service) Stats(ctx context.Context, ref string) (api.SandboxStats, error) {
	return one(s.c.Stats(ctx, ref))
}

func (s *Service) ListStats(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error) {
	if len(refs) == 0 && len(labels) > 0 {
		sbs, err := s.c.ListSandboxesLabeled(ctx, labels)
		if err != nil {
			return nil, classify(err)
		}
		if len(sbs) == 0 {
			return []api.SandboxStats{}, nil
		}
		for _, sb := range sbs {
			refs = append(refs, sb.ID)
		}
	}
	return one(s.c.StatsList(ctx, refs...))
}

// Images.

func (s *Service) ListImages(ctx context.Context) ([]api.Image, error) {
	return one(s.c.ListImages(ctx))
}

func (s *Service) Image(ctx context.Context, ref string) (api.Image, error) {
	return one(s.c.GetImage(ctx, ref))
}

func (s *Service) RemoveImage(ctx context.Context, ref string) error {
	return classify(s.c.DeleteImage(ctx, ref))
}

func (s *Service) PullImage(ctx context.Context, req api.PullImageRequest, progress func(api.ImageProgress)) (api.Image, error) {
	return one(s.c.PullImage(ctx, req, progress))
}

func (s *Service) ImportImage(ctx context.Context, path string, opts service.ImportImage, progress func(api.ImageProgress)) (api.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return api.Image{}, err
	}
	defer f.Close()
	return one(s.c.ImportImage(ctx, f, sdk.ImportImageRequest{Name: opts.Name, Source: opts.Source}, progress))
}

func (s *Service) CheckDisk(op string) error { return nil }

// Builds.

func (s *Service) CreateBuildSandbox(ctx context.Context, req api.BuildSandboxRequest) (api.Sandbox, error) {
	sb, end, err := s.c.BuildSandbox(ctx, req.From, req.Env)
	if err != nil {
		return api.Sandbox{}, classify(err)
	}
	s.mu.Lock()
	s.builds[sb.ID] = end
	s.mu.Unlock()
	return sb, nil
}

func (s *Service) EndBuild(ctx context.Context, id string) error {
	s.mu.Lock()
	end, ok := s.builds[id]
	delete(s.builds, id)
	s.mu.Unlock()
	if !ok {
		return errdefs.New(errdefs.NotFound, "no build sandbox %s on node %s", id, s.node)
	}
	err := s.c.DeleteSandbox(context.WithoutCancel(ctx), id)
	end()
	if errdefs.IsNotFound(classify(err)) {
		err = nil
	}
	return classify(err)
}

func (s *Service) Commit(ctx context.Context, ref string, req api.CommitRequest) (api.Image, error) {
	return one(s.c.Commit(ctx, ref, req))
}

// Volumes.

func (s *Service) CreateVolume(ctx context.Context, req api.CreateVolumeRequest) (api.Volume, error) {
	return one(s.c.CreateVolume(ctx, req))
}

func (s *Service) ListVolumes(ctx context.Context) ([]api.Volume, error) {
	return one(s.c.ListVolumes(ctx))
}

func (s *Service) GetVolume(ctx context.Context, ref string) (api.Volume, error) {
	return one(s.c.GetVolume(ctx, ref))
}

func (s *Service) RemoveVolume(ctx context.Context, ref string) error {
	return classify(s.c.DeleteVolume(ctx, ref))
}

func (s *Service) VolumeKey(ctx context.Context, ref string) (string, error) {
	return one(s.c.VolumeKey(ctx, ref))
}

func (s *Service) ExportVolume(ctx context.Context, ref string, w io.Writer) error {
	return classify(s.c.ExportVolume(ctx, ref, w))
}

func (s *Service) ImportVolume(ctx context.Context, name string, r io.Reader, key string) (api.Volume, error) {
	return one(s.c.ImportVolume(ctx, name, r, key))
}

// Secrets.

func (s *Service) SetSecret(ctx context.Context, name string, value []byte) (api.Secret, error) {
	return one(s.c.SetSecret(ctx, name, value))
}

func (s *Service) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	return one(s.c.ListSecrets(ctx))
}

func (s *Service) RemoveSecret(ctx context.Context, name string) error {
	return classify(s.c.DeleteSecret(ctx, name))
}

// Networks.

func (s *Service) SetNetwork(ctx context.Context, ref string, n api.Network) (api.Sandbox, error) {
	return one(s.c.SetNetwork(ctx, ref, n))
}

func (s *Service) ChangeNetwork(ctx context.Context, ref string, ch api.NetworkChange) (api.Sandbox, error) {
	return one(s.c.ChangeNetwork(ctx, ref, ch))
}

// Health.

func (s *Service) Health(ctx context.Context) (api.Health, error) {
	return one(s.c.Health(ctx))
}
