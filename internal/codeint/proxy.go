package codeint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// startScript starts the server in a sandbox unless it runs, and waits
// until its port listens (the default Python kernel is up by then). The
// server it starts is the one it reads on stdin (the daemon's,
// ServerSource), installed at RunServerPath; with nothing on stdin, the
// image's. It exits 3 when the image has no server (is not the
// code-interpreter image). A server that runs already is left running,
// with its kernels' state.
var startScript = `test -x ` + ServerPath + ` || exit 3
mkdir -p /run/clade-codeint
pid=$(cat /run/clade-codeint/server.pid 2>/dev/null)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  cat >` + RunServerPath + `.new
  if [ -s ` + RunServerPath + `.new ]; then mv -f ` + RunServerPath + `.new ` + RunServerPath + `
  else rm -f ` + RunServerPath + `.new; cp ` + ServerPath + ` ` + RunServerPath + `; fi
  setsid nohup /usr/bin/python3 ` + RunServerPath + ` >/run/clade-codeint/server.log 2>&1 </dev/null &
  echo $! >/run/clade-codeint/server.pid
fi
i=0
while ! awk '$2 ~ /:C34F$/ && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
  pid=$(cat /run/clade-codeint/server.pid)
  if ! kill -0 "$pid" 2>/dev/null; then echo "the interpreter server exited:"; tail -c 2000 /run/clade-codeint/server.log; exit 4; fi
  i=$((i+1)); [ $i -gt 2400 ] && { echo "the interpreter server is not listening after 120 s"; exit 5; }
  sleep 0.05
done
`

// StartCommand is the shell command that starts the server in a sandbox
// (what a hot pool of the code-interpreter image runs ahead); give it
// ServerSource on stdin.
func StartCommand() string { return startScript }

// Proxy carries requests to the interpreter servers of sandboxes, over
// the service's port dial (a request wakes a sleeping sandbox), starting a
// server the first time a sandbox is asked and finds none.
//
// A request goes to the server first: a sandbox the hot pool warmed (its
// image's warm step is StartCommand), a fork child or a woken sandbox has
// its server running already, and pays no start check. Only a dial that
// finds nothing listening runs Ensure and tries again. A sandbox not yet
// known to run a server in its current life (service.Traffic.Ready) has
// that first dial bounded by probeDial: a sandbox that has just woken
// holds a refused port for a while (its server may be coming back), and
// one that never ran a server must not wait that out.
type Proxy struct {
	svc service.Service
	tr  *http.Transport
	// answerWait is Config.AnswerWait; errNoAnswer says it.
	answerWait  time.Duration
	errNoAnswer error
	mu          sync.Mutex
	// started holds, per sandbox, the life (service.Traffic.Ready) in
	// which its server was seen answering.
	started map[string]any // guarded by mu
}

// DefaultAnswerWait is Config.AnswerWait's default: the longest a server
// of clade's takes to begin an answer is a kernel's start (at most 120 s)
// after an interrupt's grace (5 s).
const DefaultAnswerWait = 150 * time.Second

// Config configures a Proxy.
type Config struct {
	// AnswerWait bounds how long the server may take to begin its answer
	// to any request (0: DefaultAnswerWait; the daemon's
	// --code-answer-timeout). Shorter than a kernel's start under the
	// host's load, it fails requests a clade server would have answered.
	AnswerWait time.Duration
}

// RunBound is how long past its timeout a run may take in all: the server
// ends a run at its timeout, kills a kernel that is not back within 5 s of
// the interrupt and starts a new one (at most 120 s) before it answers,
// all within the answer wait. Past it, the daemon stops waiting for a
// server that does not end its runs (wedged, or replaced by the sandbox's
// user).
func (p *Proxy) RunBound(timeout time.Duration) time.Duration { return timeout + p.answerWait }

// probeDial bounds the first dial to a sandbox not known to run a server.
const probeDial = time.Second

// maxStarted bounds the started map (removed sandboxes leave entries).
const maxStarted = 4096

type probeKey struct{}

// NewProxy returns a proxy over svc.
func NewProxy(svc service.Service, cfg Config) *Proxy {
	if cfg.AnswerWait <= 0 {
		cfg.AnswerWait = DefaultAnswerWait
	}
	p := &Proxy{svc: svc, answerWait: cfg.AnswerWait, started: map[string]any{}}
	// A server that took a request and did not begin its answer in time.
	p.errNoAnswer = errdefs.New(errdefs.Unavailable, "the code interpreter took the request but did not answer within %s", cfg.AnswerWait)
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, _, _ := strings.Cut(addr, ":")
			if ctx.Value(probeKey{}) != nil {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, probeDial)
				defer cancel()
			}
			return svc.Dial(ctx, id, service.Wake, Port)
		},
		// No pooled connections: a connection kept across a sleep (or a
		// snapshot) is restored in the sandbox's netstack but not in the
		// host's view of it, and a request sent on it is never answered.
		// A dial per request costs well under a millisecond (the
		// sandbox's veth, else the agent's connection); the ingress does
		// the same.
		DisableKeepAlives:  true,
		DisableCompression: true,
		// What answers on the port is the sandbox's, and may be anything
		// (a wedged server, one its user replaced): at most this much of
		// an answer's headers (and they must come within the answer wait,
		// send).
		MaxResponseHeaderBytes: 64 << 10,
	}
	return p
}

// Close drops the idle connections.
func (p *Proxy) Close() { p.tr.CloseIdleConnections() }

// Ensure starts the server in sandbox id if it does not run.
func (p *Proxy) Ensure(ctx context.Context, id string) error {
	proc, err := p.svc.Exec(ctx, id, service.Wake, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", startScript}, TimeoutMS: 130_000, Stdin: true})
	if err != nil {
		return err
	}
	defer proc.Close()
	if in := proc.Stdin(); in != nil {
		go func() {
			// A script that finds a server running reads none of it.
			_, _ = in.Write(serverSource)
			_ = in.Close()
		}()
	}
	go io.Copy(io.Discard, proc.Stderr())
	out, _ := io.ReadAll(io.LimitReader(proc.Stdout(), 4096))
	exit, err := proc.Wait(ctx)
	if err != nil {
		return err
	}
	switch exit.Code {
	case 0:
		return nil
	case 3:
		return errdefs.New(errdefs.Conflict, "sandbox %s has no code interpreter: create it from the %s image (clade create --image %s)", id, Image, Image)
	}
	return errdefs.New(errdefs.Unavailable, "the code interpreter of sandbox %s did not start: %s", id, strings.TrimSpace(string(out)))
}

// Do sends a request to the server of sandbox id (path is the server's:
// /execute, /contexts...) and returns its response, which the caller
// closes. body is sent as JSON.
func (p *Proxy) Do(ctx context.Context, id, method, path string, body []byte) (*http.Response, error) {
	// Wakes a sleeping sandbox; for a running one a map lookup.
	life, err := p.svc.Ready(ctx, id, service.Wake)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	known := p.started[id] == life
	p.mu.Unlock()
	sctx := ctx
	if !known {
		sctx = context.WithValue(ctx, probeKey{}, true)
	}
	resp, err := p.send(sctx, id, method, path, body)
	if err != nil && ctx.Err() == nil && noServer(err) && !errors.Is(err, p.errNoAnswer) {
		// No server (never started, a restarted sandbox, one that
		// died): start it and try once more. Only requests that reached
		// no server are retried.
		if eerr := p.Ensure(ctx, id); eerr != nil {
			return nil, eerr
		}
		resp, err = p.send(ctx, id, method, path, body)
	}
	if err != nil {
		if errdefs.ClassOf(err) != errdefs.Internal {
			return nil, err
		}
		return nil, errdefs.New(errdefs.Unavailable, "code interpreter of sandbox %s: %v", id, err)
	}
	if !known {
		p.mu.Lock()
		if len(p.started) >= maxStarted {
			clear(p.started)
		}
		p.started[id] = life
		p.mu.Unlock()
	}
	return resp, nil
}

// noServer reports whether err is a request that reached no server: a
// refused (or, probing, timed out) dial, a connection closed before any
// answer.
func noServer(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errdefs.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
}

func (p *Proxy) send(ctx context.Context, id, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+id+path, rd)
	if err != nil {
		return nil, fmt.Errorf("code interpreter request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// The answer must begin within the answer wait (the server sends a
	// run's headers before its code runs); what follows is the run's, as
	// long as it takes, until the caller closes the body.
	hctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(p.answerWait, func() { cancel(p.errNoAnswer) })
	resp, err := p.tr.RoundTrip(req.WithContext(hctx))
	if !timer.Stop() && err == nil {
		resp.Body.Close()
		err = p.errNoAnswer
	}
	if err != nil {
		if context.Cause(hctx) == p.errNoAnswer {
			err = p.errNoAnswer
		}
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody ends its request's context when closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
