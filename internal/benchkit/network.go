package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// The network phases (issue 9) have no plain-runsc side: plain runsc has
// no network of its own to compare with. Each compares two clade paths
// measured side by side in one sample instead: a create with a network
// and one without; a request through the ingress and the same request to
// the sandbox's own address.

// appPort is the port of the bench's HTTP server inside a sandbox.
const appPort = 8000

// appScript is a small HTTP/1.1 server (keep-alive) in the default
// image's Python: GET / answers "ok", GET /zero?n=N streams N zero bytes.
// It detaches into its own session like holdScript, and its parent exits
// once the port listens, so the exec that starts it returns when it
// serves.
const appScript = `import os, sys, socket, http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One segment per small answer: buffered (flushed once the request is
    # answered), and no Nagle wait between the headers and the body.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def do_GET(self):
        n = 2
        if self.path.startswith("/zero?n="):
            n = int(self.path[8:])
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if n == 2:
            self.wfile.write(b"ok")
            return
        chunk = bytes(1 << 20)
        while n > 0:
            k = min(n, len(chunk))
            self.wfile.write(chunk[:k])
            n -= k
r, w = os.pipe()
if os.fork():
    os.close(w)
    sys.exit(0 if os.read(r, 1) else 1)
os.setsid()
os.close(r)
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
s = http.server.ThreadingHTTPServer(("0.0.0.0", ` + "8000" + `), H)
os.write(w, b"x")
os.close(w)
s.serve_forever()
`

// createApp makes a sandbox (network internet unless none) serving
// appScript on appPort, and returns its record.
func (r *runner) createApp(ctx context.Context, memoryMiB int, mode string) (sdk.Sandbox, error) {
	t := r.clade
	sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: memoryMiB, Network: &sdk.Network{Mode: mode}})
	if err != nil {
		return sdk.Sandbox{}, fmt.Errorf("create: %w", err)
	}
	t.add("sandbox", sb.ID)
	st, err := t.c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c", appScript}})
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d %s", st.Code, st.Error)
	}
	if err != nil {
		return sb, fmt.Errorf("start the HTTP server in %s: %w", sb.ID, err)
	}
	return sb, nil
}

// proxyClient returns an HTTP client and the URL of sb's appPort through
// the daemon's ingress, or, when the daemon serves none, through the API's
// port-forward (what `clade port-forward` uses). Names under .localhost
// (the ingress's usual domain) are dialled on loopback, as browsers do.
func (r *runner) proxyClient(sb sdk.Sandbox) (*http.Client, string, string) {
	if sb.Ingress == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return r.c.DialPort(ctx, sb.ID, appPort)
			}}
		return &http.Client{Transport: tr}, "http://sandbox/", "port-forward"
	}
	u := strings.ReplaceAll(sb.Ingress.URL, "{port}", strconv.Itoa(appPort))
	if !strings.HasSuffix(u, "/") {
		u += "/"
	}
	d := &net.Dialer{}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err == nil && (host == "localhost" || strings.HasSuffix(host, ".localhost")) {
				addr = net.JoinHostPort("127.0.0.1", port)
			}
			return d.DialContext(ctx, network, addr)
		}}
	c := &http.Client{Transport: &tokenTransport{base: tr, header: sb.Ingress.TokenHeader, token: sb.Ingress.TrafficToken}}
	return c, u, "ingress"
}

// tokenTransport adds a sandbox's traffic token to every request.
type tokenTransport struct {
	base          http.RoundTripper
	header, token string
}

func (t *tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set(t.header, t.token)
	}
	return t.base.RoundTrip(req)
}

// get fetches u and reads the body to its end; it returns the status and
// the bytes read.
func get(ctx context.Context, c *http.Client, u string) (int, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, n, err
}

// getOK is get that wants a 200.
func getOK(ctx context.Context, c *http.Client, u string) (int64, error) {
	code, n, err := get(ctx, c, u)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d", u, code)
	}
	return n, err
}

// phaseNetcreate: a create with network internet and one with none, in
// alternating order, each until the sandbox answers an exec.
func (r *runner) phaseNetcreate(ctx context.Context, ph *Phase) {
	t := r.clade
	i := 0
	one := func(ctx context.Context, mode string) (time.Duration, error) {
		start := time.Now()
		sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: t.memoryMiB, Network: &sdk.Network{Mode: mode}})
		if err != nil {
			return 0, fmt.Errorf("create, network %s: %w", mode, err)
		}
		t.add("sandbox", sb.ID)
		err = t.exec(ctx, sb.ID)
		d := time.Since(start)
		return d, errors.Join(err, t.remove(ctx, sb.ID))
	}
	fns := [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		i++
		modes := []string{"internet", "none"}
		if i%2 == 0 {
			modes = []string{"none", "internet"}
		}
		got := map[string]time.Duration{}
		for _, m := range modes {
			d, err := one(ctx, m)
			if err != nil {
				return nil, err
			}
			got[m] = d
			r.settle(ctx)
		}
		return []time.Duration{got["internet"], got["none"]}, nil
	}}
	series, errs := r.measure(ctx, ph.Name, []string{"create, network internet", "create, network none"}, fns)
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// phaseProxy: a keep-alive GET through the proxy next to the same GET to
// the sandbox's own address (series), then the throughput of a
// ProxyMiB download through each (Proxy).
func (r *runner) phaseProxy(ctx context.Context, ph *Phase) {
	sb, err := r.createApp(ctx, r.clade.memoryMiB, "internet")
	if err != nil {
		ph.Error = err.Error()
		return
	}
	pc, pu, via := r.proxyClient(sb)
	defer pc.CloseIdleConnections()
	dc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer dc.CloseIdleConnections()
	du := ""
	if sb.Network != nil && sb.Network.Address != "" {
		du = fmt.Sprintf("http://%s/", net.JoinHostPort(sb.Network.Address, strconv.Itoa(appPort)))
	}
	names := []string{"request via " + via}
	if du != "" {
		names = append(names, "request direct")
	}
	// A sample is the median of proxyBurst requests each way, alternating:
	// the round trip of a connection in use. A lone request after the
	// harness's settle pays for waking every process on its path from
	// idle (the daemon's, the sandbox's), and that is not what the
	// proxy adds to a keep-alive request.
	fns := [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		paths := []struct {
			c *http.Client
			u string
		}{{pc, pu}, {dc, du}}
		if du == "" {
			paths = paths[:1]
		}
		got := make([][]time.Duration, len(paths))
		for range proxyBurst {
			for i, p := range paths {
				start := time.Now()
				if _, err := getOK(ctx, p.c, p.u); err != nil {
					return nil, err
				}
				got[i] = append(got[i], time.Since(start))
			}
		}
		ds := make([]time.Duration, len(paths))
		for i, g := range got {
			slices.Sort(g)
			ds[i] = g[len(g)/2]
		}
		return ds, nil
	}}
	series, errs := r.measure(ctx, ph.Name, names, fns)
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	if errs[0] != nil {
		return
	}
	size := int64(r.cfg.ProxyMiB) << 20
	p := &Proxy{Via: via, MiB: r.cfg.ProxyMiB}
	rate := func(c *http.Client, u string) (float64, error) {
		start := time.Now()
		n, err := getOK(ctx, c, fmt.Sprintf("%szero?n=%d", u, size))
		if err == nil && n != size {
			err = fmt.Errorf("download: got %d bytes of %d", n, size)
		}
		return round3(float64(n) / (1 << 20) / time.Since(start).Seconds()), err
	}
	r.prog.Update("proxy: %d MiB via %s", r.cfg.ProxyMiB, via)
	if p.ViaMiBs, err = rate(pc, pu); err != nil {
		ph.Error = joinMsg(ph.Error, fmt.Sprintf("download via %s: %v", via, err))
	}
	if du != "" {
		r.prog.Update("proxy: %d MiB direct", r.cfg.ProxyMiB)
		if p.DirectMiBs, err = rate(dc, du); err != nil {
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("download direct: %v", err))
		}
	}
	ph.Proxy = p
}

// proxyBurst is how many requests each way one proxy sample is the median
// of.
const proxyBurst = 9

// phaseProxywake: a GET through the proxy to an app that sleeps, until its
// answer: the wake on the request's path, end to end.
func (r *runner) phaseProxywake(ctx context.Context, ph *Phase) {
	sb, err := r.createApp(ctx, r.clade.memoryMiB, "internet")
	if err != nil {
		ph.Error = err.Error()
		return
	}
	pc, pu, via := r.proxyClient(sb)
	defer pc.CloseIdleConnections()
	fns := [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		pc.CloseIdleConnections() // a sleeping app's connections are gone
		if err := r.clade.sleep(ctx, sb.ID); err != nil {
			return nil, err
		}
		r.settle(ctx)
		start := time.Now()
		_, err := getOK(ctx, pc, pu)
		return []time.Duration{time.Since(start)}, err
	}}
	series, errs := r.measure(ctx, ph.Name, []string{"request to a slept app via " + via}, fns)
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// phaseMasswake: MassWake apps slept, then one GET to each at once
// through the proxy. A 503 (the daemon's memory floor refused the wake) is
// retried after its Retry-After; every app must serve in the end.
func (r *runner) phaseMasswake(ctx context.Context, ph *Phase) {
	n, mib := r.cfg.MassWake, r.cfg.MassWakeMemoryMiB
	apps := make([]sdk.Sandbox, n)
	var mu sync.Mutex
	made := 0
	err := parallel(make([]string, n), 4, func(string) error {
		mu.Lock()
		i := made
		made++
		mu.Unlock()
		sb, err := r.createApp(ctx, mib, "internet")
		if err == nil {
			r.prog.Update("masswake: %d/%d apps made", i+1, n)
			_, err = r.c.Sleep(ctx, sb.ID)
		}
		apps[i] = sb
		return err
	})
	if err != nil {
		ph.Error = fmt.Sprintf("make %d apps: %v", n, err)
		return
	}
	r.settle(ctx)
	mw := &MassWake{Apps: n, MemoryMiB: mib}
	stop := watchMemAvailable()
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	var retried sync.Map
	start := time.Now()
	var wg sync.WaitGroup
	for i, sb := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, u, _ := r.proxyClient(sb)
			defer c.CloseIdleConnections()
			for {
				code, _, err := get(ctx, c, u)
				if err == nil && code == http.StatusServiceUnavailable {
					retried.Store(i, true)
					select {
					case <-ctx.Done():
						errs[i] = ctx.Err()
						return
					case <-time.After(massWakeRetry):
						continue
					}
				}
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("GET %s: status %d", u, code)
				}
				errs[i], lat[i] = err, time.Since(start)
				return
			}
		}()
	}
	wg.Wait()
	mw.Seconds = round3(time.Since(start).Seconds())
	mw.MemAvailableLowMiB = stop()
	retried.Range(func(any, any) bool { mw.Retried++; return true })
	var ok []time.Duration
	for i, err := range errs {
		if err != nil {
			mw.Failed++
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("app %d: %v", i, err))
			continue
		}
		ok = append(ok, lat[i])
	}
	mw.Latency = Summarize(ok)
	ph.MassWake = mw
}

// massWakeRetry is how long a masswake client waits after a 503 before it
// retries: the ingress's Retry-After is whole seconds, too coarse to
// measure a wake by, so the bench retries sooner and counts the retries.
const massWakeRetry = 200 * time.Millisecond

// watchMemAvailable samples MemAvailable every 10 ms until stop, which
// returns the lowest value seen, in MiB.
func watchMemAvailable() (stop func() float64) {
	var (
		mu   sync.Mutex
		min  = -1.0
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	sample := func() {
		if v, err := memAvailableMiB(); err == nil {
			mu.Lock()
			if min < 0 || v < min {
				min = v
			}
			mu.Unlock()
		}
	}
	sample()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return func() float64 {
		close(done)
		wg.Wait()
		sample()
		return round3(min)
	}
}
