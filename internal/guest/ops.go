package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// ExecRequest describes a process to run in the sandbox.
type ExecRequest struct {
	// Argv is the command and its arguments; Argv[0] is looked up in the
	// PATH of the process's environment unless it contains a slash.
	Argv []string
	// Env is KEY=VALUE entries on top of the sandbox's environment.
	Env []string
	// Dir is the working directory (absolute); empty means the image's.
	Dir string
	// Timeout kills the process group after this long; 0 means none. It
	// must be 0 or a whole number of milliseconds of at least 1 ms (see
	// CheckTimeout).
	Timeout time.Duration
	// Stdin makes Process.Stdin a writer to the process's stdin; without it
	// stdin is empty.
	Stdin bool
	// TTY runs the process on a new pseudo-terminal, its controlling
	// terminal in a new session: its output (stdout and stderr merged, as
	// a terminal shows them) comes on Process.Stdout, Process.Stderr stays
	// empty, and stdin is what is typed (0x03 interrupts). Rows and Cols
	// are the first size (0: 24x80); Process.Resize changes it.
	TTY        bool
	Rows, Cols uint16
	// User runs the process as that user of the sandbox — a name, "uid",
	// "uid:gid" or "name:group", resolved by the sandbox's /etc/passwd and
	// /etc/group — with its groups and login environment (HOME, USER,
	// LOGNAME, SHELL, under Env), in its home unless Dir is set. Empty: the
	// image's user.
	User string
	// Keep makes the process a kept command (not with TTY): it outlives
	// the Process. Close detaches it instead of killing it, and so does
	// the connection's end (a sleep, a daemon restart): it runs on, its
	// further output kept (the newest wire.KeptBuffer bytes) with its
	// exit, until Attach. Tag is the caller's label for it (at most
	// wire.MaxTag bytes), which Kept lists. An agent without
	// wire.FeatureKeep (an older clade's, inside an old snapshot) runs it
	// as an ordinary process.
	Keep bool
	Tag  string
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit status: 128+signal for a signalled process, 127 for
	// a command not found, -1 when the process never ran (see Error).
	Code     int
	Signal   int
	TimedOut bool
	// Error and ErrorClass (an errdefs class) say why a process did not run.
	Error      string
	ErrorClass errdefs.Class
}

// Process is a process started by Exec.
type Process struct {
	ch *call
	// Stdin is nil unless the request set Stdin; Close sends EOF.
	Stdin io.WriteCloser
	// Stdout and Stderr yield the process's output; both must be read to
	// their end (or the process closed), or the process blocks on a full
	// pipe.
	Stdout, Stderr io.Reader
}

// startPatience is how long Exec waits for the agent to say the process
// started before it checks, with a ping, that the agent is alive at all.
const startPatience = 2 * time.Second

// pingTimeout bounds a liveness check: an agent that answers nothing in this
// long while connected is frozen (e.g. SIGSTOPped). Generous: on a host
// loaded far past its cores a healthy agent was seen to miss 3 s.
const pingTimeout = 8 * time.Second

// MaxTimeout is the longest exec timeout: far beyond any use, and far from
// overflowing a time.Duration.
const MaxTimeout = 366 * 24 * time.Hour

// CheckTimeout checks an exec timeout: 0 (none) or between 1 ms and
// MaxTimeout, in whole milliseconds (the unit of the API). It returns an
// InvalidArgument error naming the bounds.
func CheckTimeout(d time.Duration) error {
	switch {
	case d == 0:
		return nil
	case d < 0:
		return errdefs.New(errdefs.InvalidArgument, "timeout %s is negative: give 0 for none or at least 1ms", d)
	case d < time.Millisecond:
		return errdefs.New(errdefs.InvalidArgument, "timeout %s is under 1ms, the smallest timeout: give 0 for none or at least 1ms", d)
	case d > MaxTimeout:
		return errdefs.New(errdefs.InvalidArgument, "timeout %s is over the longest timeout, %s", d, MaxTimeout)
	case d%time.Millisecond != 0:
		return errdefs.New(errdefs.InvalidArgument, "timeout %s is not a whole number of milliseconds", d)
	}
	return nil
}

// TimeoutFromMS converts an API timeout_ms into a Duration, refusing what
// CheckTimeout refuses and what would overflow.
func TimeoutFromMS(ms int64) (time.Duration, error) {
	if ms < 0 || ms > int64(MaxTimeout/time.Millisecond) || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, errdefs.New(errdefs.InvalidArgument, "timeout_ms %d is out of range: give 0 for none, or 1 to %d", ms, int64(MaxTimeout/time.Millisecond))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Exec starts a process and returns once it runs, or once it failed to
// start: then Wait gives the exit status that says why (code 126 or 127,
// Error set). It returns an InvalidArgument error for a bad request, and
// an Unavailable error when the agent is not connected or does not answer
// (e.g. it was stopped with SIGSTOP).
func (c *Conn) Exec(ctx context.Context, req ExecRequest) (*Process, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "empty command")
	}
	if err := CheckTimeout(req.Timeout); err != nil {
		return nil, err
	}
	if err := CheckEnv(req.Env); err != nil {
		return nil, err
	}
	if err := CheckArgv(req.Argv); err != nil {
		return nil, err
	}
	if err := c.checkUser(ctx, req.User); err != nil {
		return nil, err
	}
	if req.TTY {
		if _, err := c.session(ctx); err != nil {
			return nil, err
		}
		if !c.hasFeature(wire.FeaturePTY) {
			return nil, errdefs.New(errdefs.InvalidArgument, "this sandbox's agent predates terminals (it was made by an older clade, or restored from a snapshot of one): run without a TTY, or recreate the sandbox")
		}
	}
	keep, tag, err := c.checkKeep(ctx, req)
	if err != nil {
		return nil, err
	}
	ch, err := c.open(ctx, wire.Request{Op: wire.OpExec, Argv: req.Argv, Env: req.Env, Dir: req.Dir,
		TimeoutMS: req.Timeout.Milliseconds(), Stdin: req.Stdin, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, User: req.User,
		Keep: keep, Tag: tag})
	if err != nil {
		return nil, err
	}
	if err := ch.waitStarted(ctx); err != nil {
		ch.close()
		return nil, err
	}
	if req.User != "" {
		select { // started first: a quick command is both by now
		case <-ch.started:
		default:
			<-ch.done
			// A user the sandbox does not know is the request's fault:
			// an error, not an exit status.
			if ch.err == nil && ch.exit.Code == -1 && ch.exit.Error != "" {
				return nil, exitError(ch.exit)
			}
		}
	}
	p := &Process{ch: ch, Stdout: ch.stdout, Stderr: ch.stderr}
	if ch.stdin != nil {
		p.Stdin = ch.stdin
	}
	return p, nil
}

// SupportsUser reports whether the agent runs an exec as
// ExecRequest.User (and owns an upload by CopyInAs's user). It waits for
// the agent's session as a request would; false when there is none.
func (c *Conn) SupportsUser(ctx context.Context) bool {
	if _, err := c.session(ctx); err != nil {
		return false
	}
	return c.hasFeature(wire.FeatureUser)
}

// checkUser refuses a user for an agent that would ignore it (and run as
// root): one inside a sandbox made by an older clade, or restored from a
// snapshot of one.
func (c *Conn) checkUser(ctx context.Context, user string) error {
	if user == "" {
		return nil
	}
	if len(user) > 256 || strings.ContainsAny(user, "\x00\n") {
		return errdefs.New(errdefs.InvalidArgument, "user %.64q: give a user name or UID[:GID]", user)
	}
	if _, err := c.session(ctx); err != nil {
		return err
	}
	if !c.hasFeature(wire.FeatureUser) {
		return errdefs.New(errdefs.InvalidArgument, "this sandbox's agent predates running as another user (it was made by an older clade, or restored from a snapshot of one): leave out the user, or recreate the sandbox")
	}
	return nil
}

// waitStarted waits for the process to start (or fail to), checking that
// the agent is alive when that takes long.
func (ch *call) waitStarted(ctx context.Context) error {
	t := time.NewTimer(startPatience)
	defer t.Stop()
	for {
		select {
		case <-ch.started:
			return nil
		case <-ch.done:
			return nil // Wait has the exit, or the error that lost it
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			err := ch.s.ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				select {
				case <-ch.started:
					return nil
				case <-ch.done:
					return nil
				default:
				}
				return err
			}
			t.Reset(startPatience)
		}
	}
}

// PID returns the process's pid inside the sandbox, or 0 if it never ran.
func (p *Process) PID() int {
	select {
	case <-p.ch.started:
		return p.ch.pid
	default:
		return 0
	}
}

// Signal delivers sig to the process. It returns an Unavailable error when
// the connection is gone; signalling a process that already exited is a
// no-op.
func (p *Process) Signal(sig syscall.Signal) error {
	return errdefs.Wrap(errdefs.Unavailable, p.ch.s.conn.Write(wire.Signal, p.ch.id, stream.SignalPayload(sig)))
}

// Resize sets the terminal size of a process started with TTY; the
// process gets SIGWINCH. It is a no-op for a process without a terminal
// or one that exited, and returns an Unavailable error when the
// connection is gone; a zero dimension is an InvalidArgument error.
func (p *Process) Resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errdefs.New(errdefs.InvalidArgument, "terminal size %dx%d: rows and columns must be at least 1", rows, cols)
	}
	if !p.ch.tty {
		return nil // an agent without terminals would drop the connection
	}
	return errdefs.Wrap(errdefs.Unavailable, p.ch.s.conn.Write(wire.Resize, p.ch.id, stream.ResizePayload(rows, cols)))
}

// Wait waits for the process to exit and returns its status. The error is
// for a process lost (the connection broke: an Unavailable error, or the
// reason the sandbox went away) or ctx ending, which kills the process.
func (p *Process) Wait(ctx context.Context) (ExitStatus, error) {
	e, err := p.ch.wait(ctx)
	if err != nil {
		return ExitStatus{}, err
	}
	return ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, Error: e.Error, ErrorClass: errdefs.Class(e.ErrorClass)}, nil
}

// Close kills the process group and forgets the process (a kept one is
// detached instead, and runs on). It is safe to call more than once and
// after the process exited.
func (p *Process) Close() { p.ch.close() }

// CopyIn extracts the tar archive read from r at path inside the sandbox
// (docker cp semantics: into path if it is a directory, else as path). It
// returns once the agent has finished; a Read of r still blocked then is
// left to the caller to end (close r). An upload too big for the sandbox's
// memory fails with a ResourceExhausted error.
func (c *Conn) CopyIn(ctx context.Context, path string, r io.Reader) error {
	return c.CopyInAs(ctx, path, "", r)
}

// CopyInAs is CopyIn with every entry owned by user (as ExecRequest.User
// names one; its uid and gid), not by the archive's owners. Empty user is
// CopyIn.
func (c *Conn) CopyInAs(ctx context.Context, path, user string, r io.Reader) error {
	return c.copyIn(ctx, wire.Request{Op: wire.OpTarPut, Path: path, Stdin: true, User: user}, r)
}

// CopyInThrough writes the regular files of the tar archive r (each named
// by one path component) into the existing directory dir as a program of
// user (empty: root) writes a file, E2B's envd semantics rather than
// CopyIn's: through a symlink at a file's name, never replacing a
// directory (InvalidArgument), every file operation with user's
// credentials (wire.Request's Through). An agent that predates it (inside
// an older snapshot) gets CopyInAs instead: the caller keeps its own
// checks for those.
func (c *Conn) CopyInThrough(ctx context.Context, dir, user string, r io.Reader) error {
	req := wire.Request{Op: wire.OpTarPut, Path: dir, Stdin: true, User: user}
	if _, err := c.session(ctx); err != nil {
		return err
	}
	req.Through = c.hasFeature(wire.FeatureWriteThrough)
	return c.copyIn(ctx, req, r)
}

func (c *Conn) copyIn(ctx context.Context, req wire.Request, r io.Reader) error {
	if err := c.checkUser(ctx, req.User); err != nil {
		return err
	}
	ch, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer ch.close()
	readErr := make(chan error, 1)
	go func() {
		// Whole frames: r (an HTTP body through a pipe) hands over what
		// each client write carried, often 32 KiB, and every frame costs
		// the agent a trap or more under gVisor.
		// Only r's io.EOF ends the stream: any other error (a client
		// gone mid-body) must not look like the archive's end.
		buf := make([]byte, wire.ChunkSize)
		for {
			n, err := 0, error(nil)
			for n < len(buf) && err == nil {
				var m int
				m, err = r.Read(buf[n:])
				n += m
			}
			if n > 0 {
				if _, werr := ch.stdin.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err == io.EOF {
				_ = ch.stdin.Close()
				return
			}
			if err != nil {
				// The agent would wait for the rest forever: end the
				// transfer (the half-written file goes) with r's error.
				readErr <- err
				ch.close()
				return
			}
		}
	}()
	exit, err := ch.wait(ctx)
	select {
	case rerr := <-readErr:
		return fmt.Errorf("read the archive to copy: %w", rerr)
	default:
	}
	if err != nil {
		return err
	}
	return exitError(exit)
}

// CopyOut streams path inside the sandbox as a tar archive whose top-level
// entry is path's base name, leaving out the absolute paths in exclude (with
// what is below them). The reader ends with io.EOF only when the whole
// archive was sent; a failure part way ends it with the error. Close it.
func (c *Conn) CopyOut(ctx context.Context, path string, exclude []string) (io.ReadCloser, error) {
	ch, err := c.open(ctx, wire.Request{Op: wire.OpTarGet, Path: path, Exclude: exclude})
	if err != nil {
		return nil, err
	}
	// Sent after the open, which the agent handles before its next frame.
	if err := ch.stdout.Widen(wire.BulkWindow); err != nil {
		ch.close()
		return nil, errdefs.Wrap(errdefs.Unavailable, err)
	}
	return &copyOut{ctx: ctx, ch: ch}, nil
}

type copyOut struct {
	ctx context.Context
	ch  *call
}

func (o *copyOut) Read(p []byte) (int, error) {
	n, err := o.ch.stdout.Read(p)
	if err == io.EOF {
		exit, werr := o.ch.wait(o.ctx)
		if werr == nil {
			werr = exitError(exit)
		}
		if werr != nil {
			return n, werr
		}
	}
	return n, err
}

// WriteTo writes the archive to w as it comes, uncopied (io.Copy uses it).
func (o *copyOut) WriteTo(w io.Writer) (int64, error) {
	n, err := o.ch.stdout.WriteTo(w)
	if err != nil {
		return n, err
	}
	exit, err := o.ch.wait(o.ctx)
	if err == nil {
		err = exitError(exit)
	}
	return n, err
}

func (o *copyOut) Close() error { o.ch.close(); return nil }

// FileInfo describes a path inside the sandbox.
type FileInfo struct {
	IsDir bool
}

// Stat describes path inside the sandbox (without following a final
// symlink). A missing path is a NotFound error.
func (c *Conn) Stat(ctx context.Context, path string) (FileInfo, error) {
	ch, err := c.open(ctx, wire.Request{Op: wire.OpStatFS, Path: path})
	if err != nil {
		return FileInfo{}, err
	}
	exit, err := ch.wait(ctx)
	if err != nil {
		return FileInfo{}, err
	}
	if err := exitError(exit); err != nil {
		return FileInfo{}, err
	}
	var st wire.StatInfo
	if err := json.Unmarshal(exit.Info, &st); err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Exists {
		return FileInfo{}, errdefs.New(errdefs.NotFound, "%s: no such file or directory", path)
	}
	return FileInfo{IsDir: st.IsDir}, nil
}

// Config is the part of a guest's setup the host may change while it runs:
// after a restore a copy still has its checkpoint's. A zero field leaves
// that setting as it is; new settings (addresses, routes) are added as
// fields.
type Config struct {
	// Hostname is the sandbox's hostname.
	Hostname string
	// Clock, when set, steps the guest's clock to it (a restored VM wakes
	// with its parent's time).
	Clock time.Time
	// Seed, when set, is mixed into the guest kernel's entropy pool and
	// the pool reseeded (a restored VM has its parent's pool).
	Seed []byte
	// SecretEnv, when set, is the environment (KEY=VALUE) the agent holds
	// in memory and adds to every exec's: secrets that must not pass
	// through the engine's files (it replaces what was given before).
	SecretEnv []string
}

// Reconfigure applies cfg's non-zero fields. It is idempotent; the error is
// classed by the agent's answer, or Unavailable when it is not connected.
func (c *Conn) Reconfigure(ctx context.Context, cfg Config) error {
	wait, err := c.SendReconfigure(ctx, cfg)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// SendReconfigure is Reconfigure in two steps: it returns once the request
// is on the connection, with a function that waits for the agent's answer.
// An agent of this version applies it on its read loop, before it reads
// any request sent after it (older agents, inside snapshots, may not: use
// Reconfigure with them).
func (c *Conn) SendReconfigure(ctx context.Context, cfg Config) (wait func(context.Context) error, err error) {
	if cfg.Hostname == "" && cfg.Clock.IsZero() && len(cfg.Seed) == 0 && cfg.SecretEnv == nil {
		return func(context.Context) error { return nil }, nil
	}
	if cfg.SecretEnv != nil && !c.hasFeature(wire.FeatureSecretEnv) {
		return nil, errdefs.New(errdefs.InvalidArgument, "the agent in this sandbox is too old to take secrets in its environment: rebuild the image or snapshot with this clade")
	}
	req := wire.Request{Op: wire.OpIdentity, Hostname: cfg.Hostname, Seed: cfg.Seed, SecretEnv: cfg.SecretEnv}
	if !cfg.Clock.IsZero() {
		req.ClockNS = cfg.Clock.UnixNano()
	}
	ch, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		exit, err := ch.wait(ctx)
		if err != nil {
			return err
		}
		if err := exitError(exit); err != nil {
			return fmt.Errorf("reconfigure the guest: %w", err)
		}
		return nil
	}, nil
}
