package ingress_test

import (
	"bufio"
	"bytes"
	"fmt"
	"github.com/clade-sandbox/clade/internal/ingress"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// These play a hostile (or merely broken) sandbox: a raw TCP server on
// loopback that answers what it likes, behind the forwarder.

// rawBackend serves every connection with serve, counting connections
// opened and the ones the proxy closed (serve returned on EOF).
type rawBackend struct {
	backendServer
	ln net.Listener
}

func startRaw(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln}
	b.addr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.opened.Add(1)
			go func() {
				defer b.closed.Add(1)
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return b
}

// readHead reads a request's head off br (the forwarder's requests here
// have no body).
func readHead(br *bufio.Reader) (string, error) {
	var sb strings.Builder
	for {
		line, err := br.ReadString('\n')
		sb.WriteString(line)
		if err != nil {
			return sb.String(), err
		}
		if line == "\r\n" {
			return sb.String(), nil
		}
	}
}

// untilEOF blocks until the proxy closes c (or 10 s pass).
func untilEOF(c net.Conn, br *bufio.Reader) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, br)
}

func rawGet(t *testing.T, f *front, path string) (int, string, error) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(f.url + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// A status code below 100 ("099", "+99": three characters Go's response
// parser takes) must be a bad answer, not a panic in WriteHeader that
// leaves the sandbox connection open.
func TestForwarderStatusBelow100(t *testing.T) {
	for _, status := range []string{"099", "+99", "000"} {
		t.Run(status, func(t *testing.T) {
			be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
				if _, err := readHead(br); err != nil {
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 %s odd\r\nContent-Length: 2\r\n\r\nhi", status)
				untilEOF(c, br)
			})
			f := startFront(t, &be.backendServer, false)
			code, body, err := rawGet(t, f, "/")
			if err != nil || code != http.StatusBadGateway {
				t.Fatalf("got %d %q %v, want a 502", code, body, err)
			}
			waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == be.opened.Load() })
		})
	}
}

// A chunked answer the sandbox breaks (a bad chunk size) aborts the
// client's answer, and closes the sandbox connection: a sandbox that keeps
// it open must not keep one of the daemon's descriptors per request.
func TestForwarderBadChunkClosesSandboxConn(t *testing.T) {
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n")
		untilEOF(c, br)
	})
	f := startFront(t, &be.backendServer, false)
	if _, _, err := rawGet(t, f, "/"); err == nil {
		t.Fatal("a cut chunked answer reached the client as a whole one")
	}
	waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == 1 })
}

// A sandbox that sends an endless response head gets a 502 once the head
// passes the limit, not the daemon's memory.
func TestForwarderEndlessResponseHead(t *testing.T) {
	var sent atomic.Int64
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		line := "X-Junk: " + strings.Repeat("j", 4000) + "\r\n"
		c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for sent.Load() < 1<<30 {
			n, err := io.WriteString(c, line)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	f := startFront(t, &be.backendServer, false)
	code, body, err := rawGet(t, f, "/")
	if err != nil || code != http.StatusBadGateway {
		t.Fatalf("got %d %.200q %v, want a 502", code, body, err)
	}
	waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == 1 })
	if n := sent.Load(); n > 64<<20 {
		t.Fatalf("the proxy read %d bytes of response head", n)
	}
}

// A kept sandbox connection that closes after it took a request may have
// served it: only a request that is safe to repeat is sent again. A POST
// without a body is not (the sandbox would charge twice).
func TestForwarderRetriesOnlyIdempotent(t *testing.T) {
	for _, tc := range []struct{ method, end string }{{"POST", "fin"}, {"POST", "rst"}, {"GET", "fin"}, {"GET", "rst"}} {
		method := tc.method
		t.Run(method+"/"+tc.end, func(t *testing.T) {
			var conns, got atomic.Int64
			be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
				first := conns.Add(1) == 1
				if _, err := readHead(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				if !first {
					untilEOF(c, br)
					return
				}
				// The second request on the first connection is taken, then
				// the connection dies without an answer.
				if h, err := readHead(br); err == nil && strings.HasPrefix(h, method+" ") {
					got.Add(1)
				}
				if tc.end == "rst" {
					c.(*net.TCPConn).SetLinger(0)
				}
			})
			f := startFront(t, &be.backendServer, false)
			c := newClient(t)
			if code, _, _ := doGet(t, c, f.url+"/"); code != 200 {
				t.Fatalf("first request: %d", code)
			}
			req, _ := http.NewRequest(method, f.url+"/charge", nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			n := got.Load()
			switch method {
			case "POST":
				if n != 1 || resp.StatusCode != http.StatusBadGateway {
					t.Fatalf("POST: %d, the sandbox took it %d times; want a 502 and once", resp.StatusCode, n)
				}
			case "GET":
				if resp.StatusCode != 200 {
					t.Fatalf("GET was not sent again: %d", resp.StatusCode)
				}
			}
		})
	}
}

// recorder is a sandbox that records the requests it gets, raw.
type recorder struct {
	*rawBackend
	mu   sync.Mutex
	reqs []string
}

func startRecorder(t *testing.T) *recorder {
	rc := &recorder{}
	rc.rawBackend = startRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			var raw bytes.Buffer
			req, err := http.ReadRequest(bufio.NewReader(io.TeeReader(br, &raw)))
			_ = req
			if err != nil {
				return
			}
			body, err := io.ReadAll(req.Body)
			rc.mu.Lock()
			rc.reqs = append(rc.reqs, fmt.Sprintf("%s %s body=%q err=%v te=%v cl=%d", req.Method, req.URL, body, err, req.TransferEncoding, req.ContentLength))
			rc.mu.Unlock()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return rc
}

func (rc *recorder) seen() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.reqs...)
}

// rawExchange writes req on a new connection to f and reads the answers
// until the connection closes or goes quiet.
func rawExchange(t *testing.T, f *front, req string) []int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	var codes []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return codes
		}
		io.Copy(io.Discard, resp.Body)
		codes = append(codes, resp.StatusCode)
	}
}

// Requests meant to desynchronise the proxy and the sandbox: each is
// refused, or reaches the sandbox as one request as the proxy read it.
func TestForwarderSmuggling(t *testing.T) {
	for _, tc := range []struct {
		name, req string
		codes     []int
		seen      []string
	}{
		{"CL and TE", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
			// Transfer-Encoding wins (RFC 9112 6.3): the hidden request is a
			// request of the client's own, routed and authorized on its own.
			[]int{200, 200}, []string{`POST /a body="" err=<nil> te=[chunked] cl=-1`, `GET /b body="" err=<nil> te=[] cl=0`}},
		{"two lengths", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef", []int{400}, nil},
		{"chunked, identity", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", []int{501}, nil},
		{"identity", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc", []int{501}, nil},
		// Folded into X-A's value, which is all the sandbox sees of it.
		{"obs-fold", "GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n", []int{200}, []string{`GET /a body="" err=<nil> te=[] cl=0`}},
		// A body the proxy cannot read (bare LF ending a chunk line, a chunk
		// size past 64 bits) is a 400 at once, and a cut body for the
		// sandbox, which has its head already: never a whole one.
		{"bare LF", "GET /a HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n0\n\n", []int{400}, []string{`GET /a body="" err=unexpected EOF te=[chunked] cl=-1`}},
		{"huge chunk size", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\nabc", []int{400}, []string{`POST /a body="" err=unexpected EOF te=[chunked] cl=-1`}},
		{"negative length", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", []int{400}, nil},
		{"overflowing length", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", []int{400}, nil},
		{"chunk extensions", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=\"x\"\r\nabc\r\n0\r\n\r\n",
			[]int{200}, []string{`POST /a body="abc" err=<nil> te=[chunked] cl=-1`}},
		{"pipelined", "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
			[]int{200, 200}, []string{`GET /a body="" err=<nil> te=[] cl=0`, `GET /b body="" err=<nil> te=[] cl=0`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := startRecorder(t)
			f := startFront(t, &rc.backendServer, false)
			codes := rawExchange(t, f, tc.req)
			if fmt.Sprint(codes) != fmt.Sprint(tc.codes) {
				t.Errorf("answers %v, want %v", codes, tc.codes)
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(rc.seen()) < len(tc.seen) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // polling the recorder, which records once the sandbox's read ends
			}
			if got := rc.seen(); fmt.Sprint(got) != fmt.Sprint(tc.seen) {
				t.Errorf("the sandbox saw %q, want %q", got, tc.seen)
			}
		})
	}
}

// A sandbox that answers while it reads the body (an echo, full duplex)
// gets the body while its answer goes to the client: written first, whole,
// the body filled the sockets both ways and each side waited for the other.
func TestForwarderFullDuplex(t *testing.T) {
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(200)
		io.Copy(w, r.Body)
	}))
	f := startFront(t, be, false)
	for _, chunked := range []bool{false, true} {
		const n = 64 << 20
		var body io.Reader = bytes.NewReader(make([]byte, n))
		if chunked {
			body = io.MultiReader(body)
		}
		c := &http.Client{Timeout: 30 * time.Second}
		resp, err := c.Post(f.url+"/", "application/octet-stream", body)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		got, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || got != n {
			t.Fatalf("chunked %v: %d bytes back, %v; want %d", chunked, got, err, n)
		}
	}
}

// A client connection idle between requests keeps its sandbox connection,
// but not the buffers it reads and writes it with: an idle connection costs
// the daemon little more than the front server's own, or anyone (a public
// sandbox's ingress needs no token) could hold a GiB of its memory with
// connections that made one request each.
func TestForwarderIdleConnectionMemory(t *testing.T) {
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	f := startFront(t, be, false)
	const n = 300
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	if k := be.opened.Load(); k != n {
		t.Fatalf("%d sandbox connections for %d client connections", k, n)
	}
	// Each idle pair costs the front and the backend server (both in this
	// process) about 10 KiB each; the forwarder's 80 KiB of buffers would
	// take 24 MiB more.
	if grew := int64(heap()) - int64(before); grew > 12<<20 {
		t.Fatalf("%d idle connections hold %d KiB of heap (%d KiB each)", n, grew>>10, grew/n>>10)
	} else {
		t.Logf("%d idle connections hold %d KiB of heap", n, grew>>10)
	}
}

// 1xx answers pass to an HTTP/1.1 client, not to an HTTP/1.0 one (RFC 9110
// 15.2: a server must not send it one), which takes the final answer alone.
func TestForwarderInformational(t *testing.T) {
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, err := readHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	f := startFront(t, &be.backendServer, false)
	for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET / "+proto+"\r\nHost: x\r\nConnection: close\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		got := string(b)
		if err != nil || !strings.HasSuffix(got, "ok") {
			t.Fatalf("%s: %q %v", proto, got, err)
		}
		if early := strings.Contains(got, " 103 "); early != (proto == "HTTP/1.1") {
			t.Errorf("%s: got %q", proto, got)
		}
	}
}

// CONNECT is no request for a sandbox's port: the forwarder took a
// sandbox's 200 to it for an answer with a body until close, a tunnel the
// client could not use, and the client connection hung on it.
func TestForwarderConnect(t *testing.T) {
	rc := startRecorder(t)
	f := startFront(t, &rc.backendServer, false)
	codes := rawExchange(t, f, "CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if fmt.Sprint(codes) != "[405 200]" {
		t.Errorf("answers %v, want [405 200]", codes)
	}
	waitFor(t, "the GET to reach the sandbox", func() bool { return len(rc.seen()) > 0 })
	if got := rc.seen(); len(got) != 1 || !strings.HasPrefix(got[0], "GET /") {
		t.Errorf("the sandbox saw %q", got)
	}
}

// An answer without a Content-Type reaches the client without one: the
// front server would sniff one from the body, and an app's upload served
// untyped with nosniff would become text/html.
func TestForwarderNoSniffedType(t *testing.T) {
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		body := "<html><script>alert(1)</script>"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Content-Type-Options: nosniff\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		untilEOF(c, br)
	})
	f := startFront(t, &be.backendServer, false)
	code, _, h := doGet(t, newClient(t), f.url+"/upload")
	if _, ok := h["Content-Type"]; code != 200 || ok {
		t.Fatalf("%d, Content-Type %q: the proxy typed an untyped answer", code, h.Get("Content-Type"))
	}
}

// Connections cut at every point of an exchange leave no goroutine and no
// sandbox connection behind.
func TestForwarderAbortsLeaveNothing(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		io.Copy(w, r.Body)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 8<<20)) })
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // else the server never sees its connection close
		<-r.Context().Done()
	})
	be := startBackend(t, mux)
	f := startFront(t, be, false)
	addr := strings.TrimPrefix(f.url, "http://")
	before := runtime.NumGoroutine()
	reqs := []string{
		"GET /big HTTP/1.1\r\nHost: x\r\n",                                   // head cut
		"GET /big HTTP/1.1\r\nHost: x\r\n\r\n",                               // answer cut
		"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n",                              // no answer yet
		"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab", // body cut, echo under way
		"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
		"POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab",
	}
	for i := range 120 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, reqs[i%len(reqs)])
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		c.Read(make([]byte, 1000)) // some of the answer, if any, comes first
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for be.closed.Load() != be.opened.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if be.closed.Load() != be.opened.Load() {
		b := make([]byte, 1<<20)
		t.Fatalf("%d of %d open\n%s", be.opened.Load()-be.closed.Load(), be.opened.Load(), b[:runtime.Stack(b, true)])
	}
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before+2 })
}

// A page loaded from a signed URL sends it as the Referer of its further
// requests: the signature (which opens the port until its deadline) is
// stripped from it as from the URL, so the app does not log it.
func TestForwarderRefererLosesSignature(t *testing.T) {
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Referer()) }))
	for _, reverse := range []bool{false, true} {
		f := startFront(t, be, reverse)
		req, _ := http.NewRequest("GET", f.url+"/app.js", nil)
		req.Header.Set("Referer", "http://8000-sb.test/page?a=1&"+ingress.ExpiresParam+"=99&"+ingress.SignatureParam+"=abcdef")
		resp, err := newClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := string(b); got != "http://8000-sb.test/page?a=1" {
			t.Errorf("reverse %v: the app saw Referer %q", reverse, got)
		}
	}
}
