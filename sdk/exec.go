package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
)

// ExecRequest runs a command in a sandbox.
type ExecRequest struct {
	Cmd     []string
	Env     []string // KEY=VALUE, on top of the sandbox's environment
	Workdir string   // absolute; "/" by default
	// Timeout kills the command's whole process tree after this long; 0
	// means none. It must be a whole number of milliseconds, at least 1ms:
	// anything else is refused with an invalid-argument error, never
	// rounded.
	Timeout time.Duration
	// Stdin, when set, is streamed to the command, which sees EOF at its end.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it is produced; nil discards.
	Stdout, Stderr io.Writer
	// Signals, when set, are forwarded to the command.
	Signals <-chan os.Signal
	// TTY runs the command on a pseudo-terminal in the sandbox (its
	// controlling terminal, in a new session: job control, Ctrl-C and
	// full-screen programs work). Its output, stdout and stderr merged as
	// a terminal shows them, goes to Stdout; Stdin is what is typed (a
	// 0x03 byte interrupts the foreground job). Size is the terminal's
	// first size (zero: 24x80).
	TTY  bool
	Size WindowSize
	// Resizes, when set (with TTY), forwards each new terminal size; the
	// command gets SIGWINCH.
	Resizes <-chan WindowSize
	// User runs the command as that user of the sandbox: a name or
	// UID[:GID], with its groups, HOME, USER, LOGNAME and SHELL, in its home
	// unless Workdir is set. Empty: the image's user (root by default).
	User string
	// Started, when set, is called with the command's pid inside the
	// sandbox once it started, before any of its output (daemons before
	// the Started frame never call it).
	Started func(pid int)
	// Keep and Tag start a kept command (api.ExecRequest): it outlives
	// the call, and Peer().KeptCommands lists it and Peer().Attach follows it again.
	// These are for the nodes of a cluster (one serving a front on a
	// sandbox another node holds): they go to the peer-only route
	// /v1/internal/sandboxes/{id}/exec, which needs the cluster token
	// (--cluster-token-file); any other caller gets 401.
	Keep bool
	Tag  string
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows, Cols uint16
}

// Exec runs a command and waits for it. It returns the command's exit status;
// the error is for failures to run it at all. A command that is not found
// gives status 127 with Error set. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, ref string, req ExecRequest) (ExitStatus, error) {
	ms, err := timeoutMS(req.Timeout)
	if err != nil {
		return ExitStatus{}, err
	}
	if !req.TTY && (req.Size != WindowSize{} || req.Resizes != nil) {
		return ExitStatus{}, &Error{Code: "invalid_argument", Message: "a terminal size or resizes need TTY set"}
	}
	body, err := json.Marshal(api.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir,
		TimeoutMS: ms, Stdin: req.Stdin != nil, TTY: req.TTY, Rows: req.Size.Rows, Cols: req.Size.Cols, User: req.User,
		Keep: req.Keep, Tag: req.Tag})
	if err != nil {
		return ExitStatus{}, err
	}
	path := "/v1/sandboxes/" + url.PathEscape(ref) + "/exec"
	if req.Keep || req.Tag != "" {
		path = "/v1/internal/sandboxes/" + url.PathEscape(ref) + "/exec"
	}
	return execStream{c, path, body}.run(ctx, req)
}

// execStream is one exec stream: the route (an exec's, or an attach's to
// a kept command) and the request body.
type execStream struct {
	c    *Client
	path string
	body []byte
}

// run runs the exec stream: plain when only output comes down, else on a
// two-way stream (upgrade).
func (e execStream) run(ctx context.Context, req ExecRequest) (ExitStatus, error) {
	if req.Stdin != nil || req.Signals != nil || req.Resizes != nil {
		return e.upgrade(ctx, req)
	}
	s, err := e.start(ctx)
	if err != nil {
		return ExitStatus{}, err
	}
	defer s.Close()
	return s.copyTo(req)
}

// start sends a plain exec request and returns its stream once the
// daemon answered.
func (e execStream) start(ctx context.Context) (*ExecStream, error) {
	hreq, err := e.c.newRequest(ctx, http.MethodPost, e.path, bytes.NewReader(e.body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(stream.VersionHeader, strconv.Itoa(stream.Version))
	resp, err := e.c.do(hreq)
	if err != nil {
		return nil, err
	}
	// The transport reads the body through a buffer of its own: the
	// frames' small reads need none more.
	return &ExecStream{body: resp.Body, r: stream.NewReader(resp.Body)}, nil
}

// StartExec starts a command as Exec does, and returns once the daemon
// answered: the command started (its output follows, through Next), or
// the daemon refused it (the error is Exec's). It is for a caller that
// relays the stream (a cluster's node proxying an exec to the node that
// holds the sandbox): the frames come in the order the daemon sent them,
// stdout and stderr interleaved as produced, read in the caller's
// goroutine, and the daemon's sending waits for the caller's reading. It
// takes no Stdin, Signals, TTY or Resizes (use Exec), and does not use
// req's Stdout, Stderr or Started. The caller closes the stream.
func (c *Client) StartExec(ctx context.Context, ref string, req ExecRequest) (*ExecStream, error) {
	if req.Stdin != nil || req.Signals != nil || req.Resizes != nil || req.TTY {
		return nil, &Error{Code: "invalid_argument", Message: "StartExec streams output only: stdin, signals and a terminal need Exec"}
	}
	ms, err := timeoutMS(req.Timeout)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(api.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir, TimeoutMS: ms, User: req.User, Keep: req.Keep, Tag: req.Tag})
	if err != nil {
		return nil, err
	}
	path := "/v1/sandboxes/" + url.PathEscape(ref) + "/exec"
	if req.Keep || req.Tag != "" {
		path = "/v1/internal/sandboxes/" + url.PathEscape(ref) + "/exec"
	}
	return execStream{c, path, body}.start(ctx)
}

// ExecStream is a started command's stream of frames (api/stream), read
// by Next. It is not safe for concurrent use, but Close may be called
// while a Next waits (cancel the call's context to end a Next at once).
type ExecStream struct {
	body  io.ReadCloser // nil for an upgraded stream's (its caller closes the connection)
	r     *stream.Reader
	ended bool // the exit frame was read
	exit  ExitStatus
	err   error // the end: io.EOF after the exit frame, else why it ended
}

// Next returns the stream's next frame before its exit: stream.Started
// (JSON api.Started), stream.Stdout or stream.Stderr data, or a frame of
// a type this SDK does not know (to be skipped). The payload is valid
// until the next call. At the exit frame it returns io.EOF, and Exit says
// how the command ended; any other error ends the stream too (a stream
// cut before its exit is io.ErrUnexpectedEOF wrapped).
func (s *ExecStream) Next() (stream.Frame, error) {
	if s.err != nil {
		return stream.Frame{}, s.err
	}
	f, err := s.r.Read()
	switch {
	case err != nil:
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		s.err = fmt.Errorf("exec stream: %w", err)
	case f.Type == stream.Exit:
		s.err = io.EOF
		if err := json.Unmarshal(f.Payload, &s.exit); err != nil {
			s.exit, s.err = ExitStatus{}, fmt.Errorf("exec stream: exit frame: %w", err)
			return stream.Frame{}, s.err
		}
		s.ended = true
	default:
		return f, nil
	}
	return stream.Frame{}, s.err
}

// Exit is how the command ended, once Next returned io.EOF: its exit
// status, with an error as Exec's when the daemon could not tell it (code
// -1 with its reason). Before, or after a stream that broke, it is the
// stream's error.
func (s *ExecStream) Exit() (ExitStatus, error) {
	if !s.ended {
		if s.err == nil {
			return ExitStatus{}, fmt.Errorf("exec stream: not at its end")
		}
		return ExitStatus{}, s.err
	}
	if s.exit.Code == -1 && s.exit.Error != "" {
		return s.exit, &Error{Code: s.exit.ErrorClass, Message: s.exit.Error}
	}
	return s.exit, nil
}

// Close ends the stream. After the exit frame the connection goes back to
// the client's pool for its next call; before, it is dropped, and the
// daemon kills the command.
func (s *ExecStream) Close() error {
	if s.body == nil {
		return nil
	}
	if s.ended {
		// The exit frame is the stream's last: read the response's end
		// too, so the connection is kept (a body closed early takes its
		// connection along).
		_, _ = io.Copy(io.Discard, io.LimitReader(s.body, 4096))
	}
	return s.body.Close()
}

// copyTo writes the stream's output to req's writers (Started to its
// callback) until the exit frame; frames of types it does not know are
// skipped.
func (s *ExecStream) copyTo(req ExecRequest) (ExitStatus, error) {
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		f, err := s.Next()
		if err == io.EOF {
			return s.Exit()
		}
		if err != nil {
			return ExitStatus{}, err
		}
		switch f.Type {
		case stream.Started:
			var st api.Started
			if req.Started != nil && json.Unmarshal(f.Payload, &st) == nil && st.PID > 0 {
				req.Started(st.PID)
			}
		case stream.Stdout:
			if _, err := stdout.Write(f.Payload); err != nil {
				return ExitStatus{}, fmt.Errorf("write stdout: %w", err)
			}
		case stream.Stderr:
			if _, err := stderr.Write(f.Payload); err != nil {
				return ExitStatus{}, fmt.Errorf("write stderr: %w", err)
			}
		}
	}
}

// Peer is the calls only a cluster's nodes make on each other: they go
// to peer-only routes, which need the cluster token
// (--cluster-token-file); any other caller gets 401.
type Peer struct{ c *Client }

// Peer returns the client's calls for the nodes of a cluster.
func (c *Client) Peer() Peer { return Peer{c} }

// KeptCommands lists sandbox ref's kept commands (ExecRequest.Keep); with
// wake, a sleeping sandbox is woken first, else one that is not running
// is refused (conflict).
func (p Peer) KeptCommands(ctx context.Context, ref string, wake bool) ([]api.KeptCommand, error) {
	var out []api.KeptCommand
	err := p.c.call(ctx, http.MethodGet, "/v1/internal/sandboxes/"+url.PathEscape(ref)+"/kept?wake="+strconv.FormatBool(wake), nil, &out)
	return out, err
}

// Attach follows sandbox ref's kept command pid as Exec follows the
// command it starts: the output kept while nobody followed it, then the
// rest, then its exit (collected: a later Attach is not found). req's
// Stdout, Stderr, Stdin (the command's stdin must be open) and Signals
// are used; its command fields are not. Cancelling ctx detaches: the
// command runs on.
func (p Peer) Attach(ctx context.Context, ref string, pid int, wake bool, req ExecRequest) (ExitStatus, error) {
	if pid <= 0 {
		return ExitStatus{}, &Error{Code: "invalid_argument", Message: fmt.Sprintf("pid %d: give the pid of a kept command", pid)}
	}
	path := "/v1/internal/sandboxes/" + url.PathEscape(ref) + "/kept/" + strconv.Itoa(pid) +
		"/attach?wake=" + strconv.FormatBool(wake) + "&stdin=" + strconv.FormatBool(req.Stdin != nil)
	return execStream{p.c, path, nil}.run(ctx, req)
}

// timeoutMS converts an exec timeout to the API's milliseconds, exactly.
func timeoutMS(d time.Duration) (int64, error) {
	switch {
	case d == 0:
		return 0, nil
	case d < time.Millisecond:
		return 0, &Error{Code: "invalid_argument", Message: fmt.Sprintf("timeout %s is under 1ms, the smallest timeout: give 0 for none or at least 1ms", d)}
	case d%time.Millisecond != 0:
		return 0, &Error{Code: "invalid_argument", Message: fmt.Sprintf("timeout %s is not a whole number of milliseconds", d)}
	}
	return d.Milliseconds(), nil
}

// readStream writes output frames to req's writers until the exit frame;
// frames of types it does not know are skipped.
func readStream(r io.Reader, req ExecRequest) (ExitStatus, error) {
	s := &ExecStream{r: stream.NewReader(bufio.NewReaderSize(r, 64<<10))}
	return s.copyTo(req)
}

// upgrade runs an exec on a two-way stream: stdin and signals go up,
// output comes down.
func (e execStream) upgrade(ctx context.Context, req ExecRequest) (ExitStatus, error) {
	c, path, body := e.c, e.path, e.body
	conn, err := c.dial(ctx)
	if err != nil {
		return ExitStatus{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	hreq, err := c.newRequest(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return ExitStatus{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", api.UpgradeProtocol)
	hreq.Header.Set(stream.VersionHeader, strconv.Itoa(stream.Version))
	if err := hreq.Write(conn); err != nil {
		return ExitStatus{}, ctxErr(ctx, err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, hreq)
	if err != nil {
		return ExitStatus{}, ctxErr(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			return ExitStatus{}, decodeError(resp)
		}
		return ExitStatus{}, fmt.Errorf("daemon did not upgrade the exec stream: %s", resp.Status)
	}
	fw := stream.NewWriter(conn, nil)
	done := make(chan struct{})
	defer close(done)
	if req.Stdin != nil {
		go func() {
			buf := make([]byte, stream.ChunkSize)
			for {
				n, err := req.Stdin.Read(buf)
				if n > 0 && fw.Write(stream.Stdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					_ = fw.Write(stream.Stdin, nil)
					return
				}
			}
		}()
	}
	if req.Signals != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sig := <-req.Signals:
					if s, ok := sig.(syscall.Signal); ok {
						_ = fw.Write(stream.Signal, stream.SignalPayload(s))
					}
				}
			}
		}()
	}
	if req.Resizes != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sz, ok := <-req.Resizes:
					if !ok {
						return
					}
					if sz.Rows > 0 && sz.Cols > 0 {
						_ = fw.Write(stream.Resize, stream.ResizePayload(sz.Rows, sz.Cols))
					}
				}
			}
		}()
	}
	st, err := readStream(br, req)
	return st, ctxErr(ctx, err)
}

func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
