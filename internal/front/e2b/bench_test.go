package e2b_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/front/e2b"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// report adds p50/p99 of samples (ms) to b's output.
func report(b *testing.B, ms []float64) {
	if len(ms) == 0 {
		return
	}
	slices.Sort(ms)
	q := func(p float64) float64 { return ms[min(len(ms)-1, int(p*float64(len(ms))))] }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles are the figures
}

// BenchmarkE2BFront compares, on one daemon, commands.run('true') and
// Sandbox.create() through the E2B front (the real JS SDK, timed inside
// node) with the same work through clade's own API (the Go SDK). E2B's
// commands.run is `/bin/bash -l -c CMD`, so clade's is timed both bare and
// through the same login shell.
func BenchmarkE2BFront(b *testing.B) {
	dir := jsDir(b)
	d, url, key := startE2B(b)
	node := func(b *testing.B, op string) {
		cmd := exec.Command("node", "bench.mjs", op, strconv.Itoa(b.N))
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("node bench.mjs %s: %v", op, err)
		}
		var res struct{ MS []float64 }
		if err := json.Unmarshal(out, &res); err != nil {
			b.Fatalf("node bench.mjs %s: %v in %q", op, err, out)
		}
		report(b, res.MS)
	}
	ctx := context.Background()
	execLoop := func(b *testing.B, cmd []string) {
		sb, err := d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Client.DeleteSandbox(ctx, sb.ID)
		var ms []float64
		for b.Loop() {
			start := time.Now()
			st, err := d.Client.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: cmd})
			if err != nil || st.Code != 0 {
				b.Fatal(err, st)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		report(b, ms)
	}
	b.Run("run-true/clade-sdk", func(b *testing.B) { execLoop(b, []string{"true"}) })
	b.Run("run-true/clade-sdk-bash-l", func(b *testing.B) { execLoop(b, []string{"/bin/bash", "-l", "-c", "true"}) })
	b.Run("run-true/e2b-js", func(b *testing.B) { node(b, "run") })
	b.Run("create/clade-sdk", func(b *testing.B) {
		var ms []float64
		for b.Loop() {
			start := time.Now()
			sb, err := d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
			if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
		}
		report(b, ms)
	})
	b.Run("create/e2b-js", func(b *testing.B) { node(b, "create") })
}

// BenchmarkE2BCreateHot compares, on one daemon with hot pools of both
// images, a create through clade's own API (the Go SDK, default image;
// over its unix socket, and over TCP on loopback as the E2B front is
// reached) with E2B's create of `base` (on e2b-base) through the E2B
// front: the same Go HTTP client sending the JS SDK's request (the
// server's time, comparable with the SDK's), and the unmodified JS SDK's Sandbox.create()
// timed inside node, against the daemon and against a stub that answers at
// once (the client's own floor). Each round times one create of each kind
// in a rotating order, each once the pools are full again (a claim, not a
// refill, is timed), and removes it outside the timing. Run with
// -benchtime 30x; the figures are in docs/benchmarks.md.
func BenchmarkE2BCreateHot(b *testing.B) {
	dir := jsDir(b)
	testenv.BuiltinImage(b, image.E2BBase)
	const perImage = 2
	tcp := freeAddr(b)
	d, url, key := startE2B(b, "--e2b-base-image", image.E2BBase, "--hot-pool", fmt.Sprintf("default=%d,%s=%d", perImage, image.E2BBase, perImage), "--listen", tcp)
	ctx := b.Context()
	tcpClient, err := sdk.New("http://"+tcp, sdk.WithToken(key))
	if err != nil {
		b.Fatal(err)
	}
	full := func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		waitHot(wctx, b, d, 2*perImage)
	}
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"sandboxID":"0123456789abcdef","templateID":"base","clientID":"clade","envdVersion":"`+e2b.EnvdVersion+`","envdAccessToken":"stub"}`)
	}))
	b.Cleanup(stub.Close)

	node := exec.Command("node", "createloop.mjs")
	node.Dir = dir
	node.Env = append(os.Environ(), "E2B_API_KEY="+key)
	node.Stderr = os.Stderr
	nodeIn, err := node.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	nodeOut, err := node.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := node.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nodeIn.Close(); node.Wait() })
	lines := bufio.NewScanner(nodeOut)
	jsCreate := func(apiURL string) (float64, string) {
		if _, err := io.WriteString(nodeIn, apiURL+"\n"); err != nil {
			b.Fatal(err)
		}
		if !lines.Scan() {
			b.Fatalf("createloop.mjs ended: %v", lines.Err())
		}
		var res struct {
			MS    float64
			ID    string
			Error string
		}
		if err := json.Unmarshal(lines.Bytes(), &res); err != nil || res.Error != "" {
			b.Fatalf("createloop.mjs: %v %s in %q", err, res.Error, lines.Bytes())
		}
		return res.MS, res.ID
	}
	hc := &http.Client{}
	httpCreate := func() string {
		req, err := http.NewRequestWithContext(ctx, "POST", url+"/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ SandboxID string }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusCreated {
			b.Fatalf("POST /v2/sandboxes: %d %v", resp.StatusCode, err)
		}
		return body.SandboxID
	}
	// A first create of each kind opens the connections the timed ones reuse.
	full()
	_, id := jsCreate(url)
	d.Client.DeleteSandbox(ctx, id)
	d.Client.DeleteSandbox(ctx, httpCreate())
	jsCreate(stub.URL)
	full()
	if sb, err := tcpClient.CreateSandbox(ctx, sdk.CreateSandboxRequest{}); err != nil {
		b.Fatal(err)
	} else {
		d.Client.DeleteSandbox(ctx, sb.ID)
	}

	cladeCreate := func(c *sdk.Client) func() (float64, string) {
		return func() (float64, string) {
			start := time.Now()
			sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
			if err != nil {
				b.Fatal(err)
			}
			return float64(time.Since(start).Microseconds()) / 1000, sb.ID
		}
	}
	sides := []struct {
		name   string
		create func() (float64, string)
	}{
		{"clade-sdk", cladeCreate(d.Client)},
		{"e2b-http", func() (float64, string) {
			start := time.Now()
			id := httpCreate()
			return float64(time.Since(start).Microseconds()) / 1000, id
		}},
		{"e2b-js", func() (float64, string) { return jsCreate(url) }},
		{"js-floor", func() (float64, string) { ms, _ := jsCreate(stub.URL); return ms, "" }},
		{"clade-tcp", cladeCreate(tcpClient)},
	}
	ms := make([][]float64, len(sides))
	round := 0
	for b.Loop() {
		for k := range sides {
			i := (round + k) % len(sides)
			full()
			v, id := sides[i].create()
			ms[i] = append(ms[i], v)
			if id != "" {
				if err := d.Client.DeleteSandbox(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		}
		round++
	}
	p50 := make([]float64, len(sides))
	for i, s := range sides {
		slices.Sort(ms[i])
		p50[i] = ms[i][len(ms[i])/2]
		b.ReportMetric(p50[i], s.name+"-p50-ms")
		b.ReportMetric(ms[i][min(len(ms[i])-1, len(ms[i])*99/100)], s.name+"-p99-ms")
	}
	// The servers compared: E2B's create over HTTP against clade's own,
	// on its unix socket and on TCP as the front is reached.
	b.ReportMetric(p50[1]/p50[0], "e2b/clade-p50")
	b.ReportMetric(p50[1]/p50[4], "e2b/clade-tcp-p50")
	b.ReportMetric(0, "ns/op")
	b.Logf("hot-pool hits %d; daemon log tail:\n%s", metric(b, d, "clade_hot_pool_hits_total"), tail(grepLines(d.Log(), "e2b create"), 4000))
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
