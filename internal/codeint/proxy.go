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

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// startScript starts the server in a sandbox unless it runs, and waits
// until its port listens (the default Python kernel is up by then). It
// exits 3 when the image has no server.
var startScript = `test -x ` + ServerPath + ` || exit 3
mkdir -p /run/clade-codeint
pid=$(cat /run/clade-codeint/server.pid 2>/dev/null)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  setsid nohup /usr/bin/python3 ` + ServerPath + ` >/run/clade-codeint/server.log 2>&1 </dev/null &
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
// (what a hot pool of the code-interpreter image runs ahead).
func StartCommand() string { return startScript }

// Proxy carries requests to the interpreter servers of sandboxes, over
// the service's port dial (a request wakes a sleeping sandbox), starting a
// server the first time a sandbox is asked.
type Proxy struct {
	svc     service.Service
	tr      *http.Transport
	mu      sync.Mutex
	started map[string]bool
}

// NewProxy returns a proxy over svc.
func NewProxy(svc service.Service) *Proxy {
	p := &Proxy{svc: svc, started: map[string]bool{}}
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, _, _ := strings.Cut(addr, ":")
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
	}
	return p
}

// Close drops the idle connections.
func (p *Proxy) Close() { p.tr.CloseIdleConnections() }

// Ensure starts the server in sandbox id if it does not run.
func (p *Proxy) Ensure(ctx context.Context, id string) error {
	proc, err := p.svc.Exec(ctx, id, service.Wake, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", startScript}, TimeoutMS: 130_000})
	if err != nil {
		return err
	}
	defer proc.Close()
	go io.Copy(io.Discard, proc.Stderr())
	out, _ := io.ReadAll(io.LimitReader(proc.Stdout(), 4096))
	exit, err := proc.Wait(ctx)
	if err != nil {
		return err
	}
	switch exit.Code {
	case 0:
		p.mu.Lock()
		p.started[id] = true
		p.mu.Unlock()
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
	p.mu.Lock()
	started := p.started[id]
	p.mu.Unlock()
	if !started {
		if err := p.Ensure(ctx, id); err != nil {
			return nil, err
		}
	}
	resp, err := p.send(ctx, id, method, path, body)
	if err != nil && ctx.Err() == nil {
		// A server that is gone (a restarted sandbox) or a pooled
		// connection a sleep cut: start it if needed and try once more.
		// Only requests that reached no server are retried.
		var op *net.OpError
		if errors.As(err, &op) || errors.Is(err, io.EOF) || errdefs.IsUnavailable(err) {
			if eerr := p.Ensure(ctx, id); eerr != nil {
				return nil, eerr
			}
			resp, err = p.send(ctx, id, method, path, body)
		}
	}
	if err != nil {
		if errdefs.ClassOf(err) != errdefs.Internal {
			return nil, err
		}
		return nil, errdefs.New(errdefs.Unavailable, "code interpreter of sandbox %s: %v", id, err)
	}
	return resp, nil
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
	return p.tr.RoundTrip(req)
}
