package httpapi_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/httpapi"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/remote"
	"github.com/clade-sandbox/clade/sdk"
)

// TestRelayedExec: an exec through a node that does not hold the sandbox
// (the proxy's remote service calls the holder's API with the cluster
// token, as a cluster's nodes do) relays the holder's output and exit; a
// holder's refusal reaches the client with its class and message; a
// client that goes away mid-stream has the holder's process closed. The
// holder's process is scripted: what is tested is the relay.
func TestRelayedExec(t *testing.T) {
	h := &holderExecs{closed: make(chan struct{})}
	holder := httptest.NewServer(httpapi.RequireTokens("api-token", "peer-token", httpapi.New(httpapi.Config{}, h, prometheus.NewRegistry())))
	defer holder.Close()
	peer, err := sdk.New(holder.URL, sdk.WithToken("peer-token"))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(httpapi.New(httpapi.Config{}, remote.New(peer, "holder"), prometheus.NewRegistry()))
	defer proxy.Close()
	c, err := sdk.New(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}

	var out, errOut strings.Builder
	pid := 0
	st, err := c.Exec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"print"}, Stdout: &out, Stderr: &errOut, Started: func(p int) { pid = p }})
	if err != nil || st.Code != 3 || out.String() != "one\nthree\n" || errOut.String() != "two\n" || pid != 42 {
		t.Fatalf("relayed exec: %+v %v, pid %d, stdout %q stderr %q", st, err, pid, out.String(), errOut.String())
	}

	if _, err := c.Exec(t.Context(), "missing", sdk.ExecRequest{Cmd: []string{"print"}}); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), "no sandbox missing") {
		t.Errorf("a holder's refusal through the proxy: %v, want not found with the holder's message", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err = c.Exec(ctx, "sb", sdk.ExecRequest{Cmd: []string{"block"}, Stdout: writerFunc(func(p []byte) (int, error) {
		cancel() // the first output: the client goes
		return len(p), nil
	})})
	if err == nil {
		t.Fatal("an exec whose client went away answered no error")
	}
	select {
	case <-h.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder's process was not closed 30 s after the client went away")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// holderExecs is a holder's node: "print" writes to stdout, then stderr,
// then stdout (each after the last was read) and exits 3; "block" writes
// a line and runs until closed; sandbox "missing" is not found.
type holderExecs struct {
	service.Service
	closed chan struct{}
}

func (h *holderExecs) Exec(ctx context.Context, ref string, wake service.WakeMode, req api.ExecRequest) (service.Process, error) {
	if ref == "missing" {
		return nil, errdefs.New(errdefs.NotFound, "no sandbox %s", ref)
	}
	p := &heldProcess{closed: make(chan struct{})}
	var outW, errW *io.PipeWriter
	p.stdout, outW = io.Pipe()
	p.stderr, errW = io.Pipe()
	go func() {
		defer outW.Close()
		defer errW.Close()
		switch req.Cmd[0] {
		case "print":
			_, _ = io.WriteString(outW, "one\n")
			_, _ = io.WriteString(errW, "two\n")
			_, _ = io.WriteString(outW, "three\n")
			p.code = 3
		case "block":
			_, _ = io.WriteString(outW, "running\n")
			<-p.closed
			close(h.closed)
		}
	}()
	return p, nil
}

type heldProcess struct {
	stdout, stderr *io.PipeReader
	code           int
	once           sync.Once
	closed         chan struct{}
}

func (p *heldProcess) PID() int                        { return 42 }
func (p *heldProcess) Stdin() io.WriteCloser           { return nil }
func (p *heldProcess) Stdout() io.Reader               { return p.stdout }
func (p *heldProcess) Stderr() io.Reader               { return p.stderr }
func (p *heldProcess) Signal(sig syscall.Signal) error { return nil }
func (p *heldProcess) Resize(rows, cols uint16) error  { return nil }
func (p *heldProcess) Wait(ctx context.Context) (api.ExitStatus, error) {
	return api.ExitStatus{Code: p.code}, nil
}
func (p *heldProcess) Close() { p.once.Do(func() { close(p.closed) }) }
