package ingress_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
)

// These test the forwarder alone (no sandbox): a backend HTTP server on
// loopback stands for the sandbox's port, and the proxy's own server
// (its Server, with the connection hooks) fronts it on loopback.

// backendServer is an HTTP server on loopback counting its connections.
type backendServer struct {
	addr   string
	opened atomic.Int64
	closed atomic.Int64
	srv    *http.Server
}

func startBackend(t *testing.T, h http.Handler) *backendServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backendServer{addr: ln.Addr().String()}
	b.srv = &http.Server{Handler: h, ConnState: func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			b.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			b.closed.Add(1)
		}
	}}
	go b.srv.Serve(ln)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

// front is the proxy in front of a backend.
type front struct {
	url  string
	life int
	p    *ingress.Proxy
}

func startFront(t *testing.T, be *backendServer, reverse bool) *front {
	t.Helper()
	return startFrontConfig(t, be, reverse, ingress.Config{})
}

// startFrontConfig is startFront with the proxy's limits in cfg.
func startFrontConfig(t *testing.T, be *backendServer, reverse bool, cfg ingress.Config) *front {
	t.Helper()
	f := &front{}
	p, h := ingress.NewForwarderConfig(cfg, func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", be.addr)
	}, &f.life, reverse)
	f.p = p
	srv := p.Server()
	srv.Handler = h
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); p.Close() })
	f.url = "http://" + ln.Addr().String()
	return f
}

func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter
	}
}

func doGet(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", u, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestForwarder(t *testing.T) {
	release := make(chan struct{})
	var gone atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		r.Header.Write(w)
		fmt.Fprintf(w, "Host: %s\nURI: %s\n", r.Host, r.RequestURI)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d:%s", len(b), b)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := make([]byte, 251*4177) // a whole number of periods: byte i is i % 251
		for i := range chunk {
			chunk[i] = byte(i % 251)
		}
		for n > 0 {
			k := min(n, len(chunk))
			w.Write(chunk[:k])
			n -= k
		}
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "second\n")
		w.Header().Set("X-Sum", "42")
	})
	arrived := make(chan struct{}, 1)
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
		gone.Add(1)
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	})
	mux.HandleFunc("/early", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	be := startBackend(t, mux)
	f := startFront(t, be, false)

	t.Run("keep-alive requests share one sandbox connection", func(t *testing.T) {
		c := newClient(t)
		before := be.opened.Load()
		for i := range 5 {
			if code, body, _ := doGet(t, c, f.url+"/hello"); code != 200 || body != "hello" {
				t.Fatalf("request %d: %d %q", i, code, body)
			}
		}
		if n := be.opened.Load() - before; n != 1 {
			t.Fatalf("5 requests on one client connection opened %d sandbox connections, want 1", n)
		}
	})
	t.Run("a new life of the sandbox dials again", func(t *testing.T) {
		c := newClient(t)
		doGet(t, c, f.url+"/hello")
		before := be.opened.Load()
		f.life++
		if code, body, _ := doGet(t, c, f.url+"/hello"); code != 200 || body != "hello" {
			t.Fatalf("%d %q", code, body)
		}
		if n := be.opened.Load() - before; n != 1 {
			t.Fatalf("after a wake: %d new sandbox connections, want 1", n)
		}
	})
	t.Run("a connection the sandbox closed while idle is not used", func(t *testing.T) {
		c := newClient(t)
		doGet(t, c, f.url+"/hello")
		be.srv.SetKeepAlivesEnabled(false) // closes idle connections
		waitFor(t, "the backend to close its idle connection", func() bool { return be.closed.Load() == be.opened.Load() })
		be.srv.SetKeepAlivesEnabled(true)
		if code, body, _ := doGet(t, c, f.url+"/hello"); code != 200 || body != "hello" {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("headers: hop-by-hop, token and Go's user agent stay behind; forwarding headers are set", func(t *testing.T) {
		c := newClient(t)
		req, _ := http.NewRequest("GET", f.url+"/headers?a=1", nil)
		req.Host = "1-sb.test"
		req.Header.Set(ingress.TokenHeader, "secret")
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "1")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		req.Header.Set("X-App", "kept")
		req.Header.Set("User-Agent", "")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := string(b)
		for _, bad := range []string{"secret", "X-Hop", "Keep-Alive", "6.6.6.6", "Go-http-client"} {
			if strings.Contains(got, bad) {
				t.Errorf("the sandbox saw %q:\n%s", bad, got)
			}
		}
		for _, want := range []string{"X-App: kept", "X-Forwarded-For: 127.0.0.1", "X-Forwarded-Host: 1-sb.test", "X-Forwarded-Proto: http", "Host: 1-sb.test", "URI: /headers?a=1"} {
			if !strings.Contains(got, want) {
				t.Errorf("the sandbox did not see %q:\n%s", want, got)
			}
		}
	})
	t.Run("request bodies, known length and chunked", func(t *testing.T) {
		c := newClient(t)
		for _, chunked := range []bool{false, true} {
			body := strings.Repeat("x", 300<<10)
			var rd io.Reader = strings.NewReader(body)
			if chunked {
				rd = io.MultiReader(rd) // hides the length
			}
			resp, err := c.Post(f.url+"/echo", "text/plain", rd)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("%d:%s", len(body), body); string(b) != want {
				t.Fatalf("chunked %v: got %d bytes back, want %d", chunked, len(b), len(want))
			}
		}
	})
	t.Run("an early answer beats the unread body", func(t *testing.T) {
		c := newClient(t)
		resp, err := c.Post(f.url+"/early", "text/plain", bytes.NewReader(make([]byte, 8<<20)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", resp.StatusCode)
		}
	})
	t.Run("a large body arrives whole", func(t *testing.T) {
		c := newClient(t)
		const n = 48<<20 + 7
		resp, err := c.Get(f.url + "/big?n=" + strconv.Itoa(n))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.ContentLength != n {
			t.Fatalf("Content-Length %d, want %d", resp.ContentLength, n)
		}
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for i := 0; i < n; i++ {
			b, err := br.ReadByte()
			if err != nil {
				t.Fatalf("byte %d: %v", i, err)
			}
			if b != byte(i%251) {
				t.Fatalf("byte %d is %d, want %d", i, b, i%251)
			}
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after %d bytes: %v", n, err)
		}
		// And the connection serves on.
		if code, body, _ := doGet(t, c, f.url+"/hello"); code != 200 || body != "hello" {
			t.Fatalf("after the body: %d %q", code, body)
		}
	})
	t.Run("a chunked answer streams, with its trailer", func(t *testing.T) {
		c := newClient(t)
		resp, err := c.Get(f.url + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "first\n" {
			t.Fatalf("first piece: %q %v (it must arrive before the server ends)", line, err)
		}
		close(release)
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "second\n" {
			t.Fatalf("rest: %q %v", rest, err)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "42" {
			t.Fatalf("trailer X-Sum %q, want 42", got)
		}
	})
	t.Run("a client that goes away ends the sandbox's request", func(t *testing.T) {
		c := newClient(t)
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/hang", nil)
		done := make(chan error, 1)
		go func() {
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		<-arrived
		cancel()
		<-done
		waitFor(t, "the sandbox's request to end", func() bool { return gone.Load() == 1 })
	})
	t.Run("connection close, 204 and HEAD", func(t *testing.T) {
		c := newClient(t)
		if code, body, _ := doGet(t, c, f.url+"/close"); code != 200 || body != "bye" {
			t.Fatalf("close: %d %q", code, body)
		}
		if code, body, _ := doGet(t, c, f.url+"/nocontent"); code != 204 || body != "" {
			t.Fatalf("204: %d %q", code, body)
		}
		resp, err := c.Head(f.url + "/hello")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("HEAD: %v %v", resp, err)
		}
		resp.Body.Close()
		if code, body, _ := doGet(t, c, f.url+"/hello"); code != 200 || body != "hello" {
			t.Fatalf("after HEAD: %d %q", code, body)
		}
	})
	t.Run("a client connection that closes closes its sandbox connection", func(t *testing.T) {
		// A backend and front of its own: no other subtest's connections
		// close under the count.
		be := startBackend(t, mux)
		f := startFront(t, be, false)
		c := newClient(t)
		doGet(t, c, f.url+"/hello")
		if n := be.opened.Load(); n != 1 {
			t.Fatalf("%d sandbox connections opened, want 1", n)
		}
		if n := be.closed.Load(); n != 0 {
			t.Fatalf("the sandbox connection closed under an open client connection")
		}
		c.Transport.(*http.Transport).CloseIdleConnections()
		waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == 1 })
	})
	t.Run("a sandbox that does not answer is a 502", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		f2 := startFront(t, &backendServer{addr: addr}, false)
		if code, body, _ := doGet(t, newClient(t), f2.url+"/hello"); code != http.StatusBadGateway || !strings.Contains(body, "did not answer") {
			t.Fatalf("%d %q", code, body)
		}
	})
}

// TestForwarderConcurrent sends many requests on many client connections
// at once, with the sandbox's connections changing lives under them.
func TestForwarderConcurrent(t *testing.T) {
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) }))
	f := startFront(t, be, false)
	c := newClient(t)
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = 16
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := fmt.Sprintf("/%d/%d", g, i)
				resp, err := c.Get(f.url + p)
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != p {
					errs <- fmt.Errorf("%s answered %q", p, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// BenchmarkForwarder: a keep-alive GET on loopback straight to the backend,
// through the forwarder and through the reverse proxy (the way before it);
// and a 256 MiB download each way.
func BenchmarkForwarder(b *testing.B) {
	body := make([]byte, 256<<20)
	be := startBackendB(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body)
			return
		}
		io.WriteString(w, "ok")
	}))
	for _, way := range []string{"direct", "forward", "reverseproxy"} {
		u := "http://" + be
		if way != "direct" {
			u = startFrontB(b, be, way == "reverseproxy")
		}
		b.Run("rtt/"+way, func(b *testing.B) {
			c := newClient(b)
			for b.Loop() {
				resp, err := c.Get(u + "/")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		b.Run("256MiB/"+way, func(b *testing.B) {
			c := newClient(b)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				resp, err := c.Get(u + "/big")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

func startBackendB(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func startFrontB(b *testing.B, addr string, reverse bool) string {
	life := 0
	p, h := ingress.NewForwarder(func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}, &life, reverse)
	srv := p.Server()
	srv.Handler = h
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close(); p.Close() })
	return "http://" + ln.Addr().String()
}
