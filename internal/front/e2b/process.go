package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process"
	"github.com/clade-sandbox/clade/internal/service"
)

// processes tracks the commands started through envd, per sandbox, so that
// a command outlives the stream that started it and is found again by
// List and Connect. A command leaves the table when it ends.
type processes struct {
	mu    sync.Mutex
	procs map[string]map[uint32]*proc // sandbox id -> pid -> command
	// adopt is held while a kept command is attached to (kept.go).
	adopt sync.Mutex
}

func newProcesses() *processes { return &processes{procs: map[string]map[uint32]*proc{}} }

func (t *processes) add(id string, p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id] == nil {
		t.procs[id] = map[uint32]*proc{}
	}
	t.procs[id][p.pid] = p
}

func (t *processes) remove(id string, p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id][p.pid] == p {
		delete(t.procs[id], p.pid)
		if len(t.procs[id]) == 0 {
			delete(t.procs, id)
		}
	}
}

// find returns sandbox id's command by pid or tag, or a NotFound error.
func (t *processes) find(id string, sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p := t.procs[id][v.Pid]; p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *process.ProcessSelector_Tag:
		for _, p := range t.procs[id] {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("select the process by pid or tag"))
}

func (t *processes) list(id string) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := slices.Collect(maps.Values(t.procs[id]))
	slices.SortFunc(out, func(a, b *proc) int { return int(a.pid) - int(b.pid) })
	return out
}

// forget kills and drops sandbox id's commands (it was killed or paused).
func (t *processes) forget(id string) {
	t.mu.Lock()
	ps := t.procs[id]
	delete(t.procs, id)
	t.mu.Unlock()
	for _, p := range ps {
		p.gp.Close()
	}
}

func (t *processes) closeAll() {
	t.mu.Lock()
	ids := slices.Collect(maps.Keys(t.procs))
	t.mu.Unlock()
	for _, id := range ids {
		t.forget(id)
	}
}

// proc is one command and the streams watching it.
type proc struct {
	pid    uint32
	tag    *string
	config *process.ProcessConfig
	gp     service.Process
	// tty: the command runs on a pseudo-terminal of the agent's; its
	// output is pty data and its input pty input.
	tty bool

	mu   sync.Mutex
	subs map[*sub]struct{}
	end  *process.ProcessEvent_EndEvent // set once it ended
	// lost, set with end, is why the command's end is unknown: its
	// sandbox was killed or paused under it. Its streams end with it
	// instead of an end event (see sandboxLost).
	lost error
	done chan struct{} // closed when it ended
}

// sub is one stream's view of a command's events. Sends block while the
// stream is slow, holding the command's output back (as a pipe would)
// instead of dropping it; a stream that went away unsubscribes.
type sub struct {
	ch   chan *process.ProcessEvent
	gone chan struct{}
}

func (p *proc) subscribe() (*sub, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &sub{ch: make(chan *process.ProcessEvent, 64), gone: make(chan struct{})}
	if p.end != nil {
		return s, false
	}
	p.subs[s] = struct{}{}
	return s, true
}

func (p *proc) unsubscribe(s *sub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// publish sends ev to every stream watching.
func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := slices.Collect(maps.Keys(p.subs))
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// pump copies one output of the command to its streams.
func (p *proc) pump(r io.Reader, stderr bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			b := bytes.Clone(buf[:n])
			d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			if p.tty {
				d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}
			} else if stderr {
				d = &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			}
			p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
		}
		if err != nil {
			return
		}
	}
}

// run pumps the command's output until it ends, then sends the end event
// and drops the command from the table. A command whose end is unknown
// because its sandbox went (killed, timed out, paused) sends no end
// event: its streams end with the error sandboxLost says.
func (p *proc) run(s *Server, id string) {
	t := s.procs
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(p.gp.Stdout(), false) }()
	go func() { defer wg.Done(); p.pump(p.gp.Stderr(), true) }()
	wg.Wait()
	exit, err := p.gp.Wait(context.Background())
	end := endEvent(exit, err)
	var lost error
	if err != nil {
		lost = s.sandboxLost(id)
	}
	p.mu.Lock()
	p.end, p.lost = end, lost
	p.mu.Unlock()
	if lost == nil {
		p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
	}
	p.mu.Lock()
	for s := range p.subs {
		close(s.ch)
		delete(p.subs, s)
	}
	p.mu.Unlock()
	close(p.done)
	t.remove(id, p)
	p.gp.Close()
}

// sandboxLost says why a command whose end is unknown has no end: its
// sandbox is gone or no longer running (killed, timed out, paused). On
// E2B the stream of such a command breaks and the SDK, finding the
// sandbox gone, raises TimeoutError ("the sandbox was killed or reached
// its end of life"); Connect's unavailable code is the same class in every
// SDK, said without a broken connection. nil: the sandbox still runs (the
// agent's connection broke under a live sandbox), and the command ends
// with an error end event as before.
func (s *Server) sandboxLost(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := s.svc.Get(ctx, id)
	switch {
	case errdefs.IsNotFound(err):
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s was killed while the command ran", id))
	case err != nil:
		return nil
	case stateOf(sb) == "paused":
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s was paused while the command ran", id))
	case stateOf(sb) != "running":
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s is %s: it was killed while the command ran", id, sb.State))
	}
	return nil
}

// endEvent says how a command ended the way envd does: exited with a code,
// or a status naming the signal.
func endEvent(exit api.ExitStatus, err error) *process.ProcessEvent_EndEvent {
	if err != nil {
		msg := err.Error()
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "error", Error: &msg}
	}
	e := &process.ProcessEvent_EndEvent{ExitCode: int32(exit.Code)}
	switch {
	case exit.Error != "":
		msg := exit.Error
		e.Error = &msg
		e.Status = "error: " + exit.Error
	case exit.TimedOut:
		msg := "the command's timeout passed"
		e.Error = &msg
		e.Status = "signal: killed"
	case exit.Signal != 0:
		e.Status = "signal: " + syscall.Signal(exit.Signal).String()
	default:
		e.Exited = true
		e.Status = "exit status " + strconv.Itoa(exit.Code)
	}
	return e
}

// deadlineGrace is how long after its stream's deadline a command is
// killed.
const deadlineGrace = 500 * time.Millisecond

// processService implements envd's Process service on clade's agent.
type processService struct {
	s *Server
}

// sandboxID is the sandbox an envd request is for (checked by ServeHTTP).
func sandboxID(h interface{ Get(string) string }) string { return h.Get("E2b-Sandbox-Id") }

// resolve makes p absolute: relative paths are from the user's home.
func resolve(p string) string {
	switch {
	case p == "" || p == "~":
		return Home
	case strings.HasPrefix(p, "~/"):
		return path.Join(Home, p[2:])
	case !path.IsAbs(p):
		return path.Join(Home, p)
	}
	return path.Clean(p)
}

// connectErr turns a clade error into a Connect error with the matching
// code, so the SDKs raise the error class they raise against E2B.
func connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	code := connect.CodeInternal
	switch errdefs.ClassOf(err) {
	case errdefs.NotFound:
		code = connect.CodeNotFound
	case errdefs.AlreadyExists:
		code = connect.CodeAlreadyExists
	case errdefs.InvalidArgument:
		code = connect.CodeInvalidArgument
	case errdefs.Conflict:
		code = connect.CodeFailedPrecondition
	case errdefs.Unavailable:
		code = connect.CodeUnavailable
	case errdefs.ResourceExhausted:
		code = connect.CodeResourceExhausted
	case errdefs.Unauthenticated:
		code = connect.CodeUnauthenticated
	}
	return connect.NewError(code, err)
}

// keepaliveInterval is the interval the client asked for in
// Keepalive-Ping-Interval (seconds), or 0 for none.
func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	id := sandboxID(req.Header())
	m := req.Msg
	cfg := m.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty: give the command to run"))
	}
	named, err := headerUser(req.Header())
	if err != nil {
		return connectErr(err)
	}
	var env []string
	for _, k := range slices.Sorted(maps.Keys(cfg.GetEnvs())) {
		env = append(env, k+"="+cfg.GetEnvs()[k])
	}
	var dir string
	if cfg.Cwd != nil {
		dir = resolve(cfg.GetCwd())
	}
	// The stream's deadline (Connect-Timeout-Ms) bounds the command, as in
	// envd: a client's timeoutMs kills a command that runs longer. The
	// kill comes a moment after the deadline, so that the stream ends with
	// deadline_exceeded (TimeoutError) rather than the kill's exit.
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl).Truncate(time.Millisecond)
		if left < time.Millisecond {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed before the command started"))
		}
		timeout = left + deadlineGrace
	}
	// As the user, the agent sets HOME and starts in the user's home (as
	// envd does); without one (an old agent) as root in E2B's home.
	user, err := ps.s.execUser(ctx, id, named)
	if err != nil {
		return connectErr(err)
	}
	if user == "" {
		env = append([]string{"HOME=" + Home}, env...)
		if dir == "" {
			dir = Home
		}
	}
	// envd keeps stdin open unless the client says stdin:false.
	stdin := m.Stdin == nil || m.GetStdin()
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	er := api.ExecRequest{Cmd: argv, Env: env, Workdir: dir, TimeoutMS: timeout.Milliseconds(), Stdin: stdin, User: user}
	tty := m.GetPty() != nil
	if tty {
		// The agent's own terminal: the process is its session leader,
		// its input is what is typed (always open, as envd's).
		rows, cols, err := ptySize(m.GetPty().GetSize())
		if err != nil {
			return err
		}
		er.TTY, er.Rows, er.Cols, er.Stdin = true, rows, cols, true
	}
	// The process must not end with this request: the stream may go away
	// and the command live on (background commands), across a pause too
	// (kept.go; not a PTY's).
	if !tty {
		er.Keep, er.Tag = true, keptTag(m.Tag, cfg, user)
	}
	gp, err := ps.s.svc.Exec(context.WithoutCancel(ctx), id, service.Wake, er)
	if err != nil {
		return connectErr(err)
	}
	pid := gp.PID()
	if pid == 0 {
		// It did not start: say why as envd would, with start and end.
		exit, werr := gp.Wait(ctx)
		gp.Close()
		if werr == nil && exit.Error == "" {
			exit.Error = "the command did not start"
		}
		end := endEvent(exit, werr)
		if err := stream.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 0}}}}); err != nil {
			return err
		}
		return stream.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}})
	}
	p := &proc{pid: uint32(pid), tag: m.Tag, config: cfg, gp: gp, tty: tty, subs: map[*sub]struct{}{}, done: make(chan struct{})}
	s, _ := p.subscribe()
	ps.s.procs.add(id, p)
	go p.run(ps.s, id)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	return follow(ctx, p, s, keepaliveInterval(req.Header()), send)
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, s, err := ps.s.findProc(ctx, sandboxID(req.Header()), req.Msg.GetProcess(), true)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	return follow(ctx, p, s, keepaliveInterval(req.Header()), send)
}

// follow streams a command's events to one client: start first, then its
// output and keepalives until it ends or the client goes away (which
// leaves the command running).
func follow(ctx context.Context, p *proc, s *sub, every time.Duration, send func(*process.ProcessEvent) error) error {
	defer p.unsubscribe(s)
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-s.ch:
			if !ok {
				p.mu.Lock()
				lost := p.lost
				p.mu.Unlock()
				return lost
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			// The deadline (the client's timeoutMs) ends the stream with
			// deadline_exceeded, as envd does; the command is killed.
			return connectErr(ctx.Err())
		}
	}
}

func (ps *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	return connect.NewResponse(&process.ListResponse{Processes: ps.s.listProcs(ctx, sandboxID(req.Header()))}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, _, err := ps.s.findProc(ctx, sandboxID(req.Header()), req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: use SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal()))
	}
	if err := p.gp.Signal(sig); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, _, err := ps.s.findProc(ctx, sandboxID(req.Header()), req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// write sends input to the command's stdin.
func (p *proc) write(in *process.ProcessInput) error {
	data := in.GetStdin()
	if _, ok := in.GetInput().(*process.ProcessInput_Pty); ok {
		if !p.tty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY", p.pid))
		}
		data = in.GetPty()
	}
	stdin := p.gp.Stdin()
	if stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d was started with stdin: false", p.pid))
	}
	if _, err := stdin.Write(data); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: writing stdin: %w", p.pid, err))
	}
	return nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, _, err := ps.s.findProc(ctx, sandboxID(stream.RequestHeader()), ev.Start.GetProcess(), false)
			if err != nil {
				return nil, err
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send the start event (which process) before data"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, _, err := ps.s.findProc(ctx, sandboxID(req.Header()), req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	stdin := p.gp.Stdin()
	if stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d was started with stdin: false", p.pid))
	}
	if err := stdin.Close(); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, _, err := ps.s.findProc(ctx, sandboxID(req.Header()), req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if !p.tty {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY to resize", p.pid))
		}
		rows, cols, err := ptySize(sz)
		if err != nil {
			return nil, err
		}
		// The resize goes to the agent on the process's own channel,
		// after its start: the terminal is there before the pid is known.
		if err := p.gp.Resize(rows, cols); err != nil {
			return nil, connectErr(fmt.Errorf("resize the PTY of process %d: %w", p.pid, err))
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// ptySize checks a terminal size from a client: a side left 0 is the
// default's (24 rows, 80 columns), and each must fit a terminal's.
func ptySize(sz *process.PTY_Size) (rows, cols uint16, err error) {
	r, c := sz.GetRows(), sz.GetCols()
	if r == 0 {
		r = 24
	}
	if c == 0 {
		c = 80
	}
	if r > math.MaxUint16 || c > math.MaxUint16 {
		return 0, 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("terminal size %dx%d: at most %d rows and columns", r, c, math.MaxUint16))
	}
	return uint16(r), uint16(c), nil
}

// run runs argv in sandbox id to its end and returns its output. A
// non-zero exit is an error classed by what the command said on stderr.
func (s *Server) run(ctx context.Context, id string, argv ...string) (stdout, stderr string, err error) {
	return s.runAs(ctx, id, "", argv...)
}

// runOutputMax bounds the output of a command run for the front (a
// ListDir's find of a directory of many files is the largest).
const runOutputMax = 64 << 20

// runAs is run as user (a name or UID[:GID] of the sandbox; empty: root
// with E2B's home).
func (s *Server) runAs(ctx context.Context, id, user string, argv ...string) (stdout, stderr string, err error) {
	req := api.ExecRequest{Cmd: argv, Env: []string{"HOME=" + Home}, User: user}
	if user != "" {
		req.Env, req.Workdir = nil, "/"
	}
	p, err := s.svc.Exec(ctx, id, service.Wake, req)
	if err != nil {
		return "", "", err
	}
	defer p.Close()
	var ob, eb bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(&eb, io.LimitReader(p.Stderr(), 1<<20))
		_, _ = io.Copy(io.Discard, p.Stderr())
	}()
	// The sandbox's programs may be anything (its user may replace them):
	// what the daemon holds of their output is bounded.
	if n, _ := io.Copy(&ob, io.LimitReader(p.Stdout(), runOutputMax+1)); n > runOutputMax {
		p.Close()
		return "", "", errdefs.New(errdefs.ResourceExhausted, "%s printed more than %d MiB: a sandbox's answer is bounded", argv[0], runOutputMax>>20)
	}
	wg.Wait()
	exit, err := p.Wait(ctx)
	if err != nil {
		return ob.String(), eb.String(), err
	}
	if exit.Code != 0 {
		msg := strings.TrimSpace(eb.String())
		if exit.Error != "" {
			msg = exit.Error
		}
		c := errdefs.InvalidArgument
		switch {
		case strings.Contains(msg, "No such file or directory"):
			c = errdefs.NotFound
		case strings.Contains(msg, "File exists"):
			c = errdefs.AlreadyExists
		}
		return ob.String(), eb.String(), errdefs.New(c, "%s", msg)
	}
	return ob.String(), eb.String(), nil
}
