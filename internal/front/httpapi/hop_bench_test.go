package httpapi_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/front/httpapi"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/remote"
	"github.com/clade-sandbox/clade/sdk"
)

// BenchmarkExecHop measures what the proxied exec's hop costs a node in
// CPU, apart from the sandbox: an exec of a scripted process (pid 42, the
// output below, exit 0) through the API of the node that holds it
// (direct, over a unix socket as the CLI calls it), and through the API
// of another node (proxied: that node's remote service calls the holder's
// API over TCP with the cluster token, as a cluster's nodes do). On an
// idle machine the two ns/op's difference is the hop's wall time;
// cpu-µs/op is the CPU the whole exec took (client and nodes: one
// process), whose difference is what the hop costs in CPU whatever the
// machine's load does to the wall time; allocs/op counts all of them too.
// TestNetClusterCosts measures the hop between real nodes.
//
//	go test ./internal/front/httpapi/ -run '^$' -bench ExecHop -benchmem
func BenchmarkExecHop(b *testing.B) {
	for _, out := range []struct {
		name string
		text string
	}{{"silent", ""}, {"4KiB", strings.Repeat("x", 4096)}} {
		holder := httptest.NewServer(httpapi.RequireTokens("api-token", "peer-token",
			httpapi.New(httpapi.Config{}, scriptedExecs{out: out.text}, prometheus.NewRegistry())))
		peer, err := sdk.New(holder.URL, sdk.WithToken("peer-token"))
		if err != nil {
			b.Fatal(err)
		}
		proxy := unixServer(b, httpapi.New(httpapi.Config{}, remote.New(peer, "holder"), prometheus.NewRegistry()))
		direct := unixServer(b, httpapi.New(httpapi.Config{}, scriptedExecs{out: out.text}, prometheus.NewRegistry()))
		for _, via := range []struct {
			name string
			sock string
		}{{"direct", direct}, {"proxied", proxy}} {
			b.Run(out.name+"/"+via.name, func(b *testing.B) {
				c, err := sdk.New(via.sock)
				if err != nil {
					b.Fatal(err)
				}
				var got countWriter
				b.ReportAllocs()
				cpu0 := processCPU(b)
				for b.Loop() {
					got.n = 0
					st, err := c.Exec(b.Context(), "sb", sdk.ExecRequest{Cmd: []string{"true"}, Stdout: &got})
					if err != nil || st.Code != 0 || got.n != len(out.text) {
						b.Fatalf("exec: %+v %v, %d bytes of output, want %d", st, err, got.n, len(out.text))
					}
				}
				b.ReportMetric(float64(processCPU(b)-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			})
		}
		holder.Close()
	}
}

// processCPU is the user and system CPU time this process used, in ns:
// the client's, the proxy's and the holder's together.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// unixServer serves h on a unix socket of the test's until its end.
func unixServer(b *testing.B, h http.Handler) string {
	sock := filepath.Join(b.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	return sock
}

// scriptedExecs is a node whose every exec is a scripted process; it
// serves nothing else (the other calls panic: the benchmark makes none).
type scriptedExecs struct {
	service.Service
	out string
}

func (s scriptedExecs) Exec(ctx context.Context, ref string, wake service.WakeMode, req api.ExecRequest) (service.Process, error) {
	return &scriptedProcess{stdout: strings.NewReader(s.out)}, nil
}

type scriptedProcess struct{ stdout io.Reader }

func (p *scriptedProcess) PID() int                        { return 42 }
func (p *scriptedProcess) Stdin() io.WriteCloser           { return nil }
func (p *scriptedProcess) Stdout() io.Reader               { return p.stdout }
func (p *scriptedProcess) Stderr() io.Reader               { return strings.NewReader("") }
func (p *scriptedProcess) Signal(sig syscall.Signal) error { return nil }
func (p *scriptedProcess) Resize(rows, cols uint16) error  { return nil }
func (p *scriptedProcess) Wait(ctx context.Context) (api.ExitStatus, error) {
	return api.ExitStatus{}, nil
}
func (p *scriptedProcess) Close() {}
