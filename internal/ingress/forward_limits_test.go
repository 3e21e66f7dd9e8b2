package ingress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
)

// These test the forwarder's time and size limits against a hostile (or
// stuck) sandbox and client, both on loopback sockets.

// rawDo sends req (a whole request, as bytes) on a fresh connection to f
// and reads one answer, within 20 s (a hang past the proxy's limits is a
// failure, not a test that never ends).
func rawDo(t *testing.T, f *front, req string, more func(c net.Conn)) (*http.Response, string, error) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if more != nil {
		go more(c)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// A sandbox that takes a request and never answers gets a 504 at the
// response-header timeout, with or without a request body, on the
// forwarder and on the upgrade way; its connection is closed.
func TestForwarderResponseHeaderTimeout(t *testing.T) {
	for _, tc := range []struct{ name, req string }{
		{"GET", "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"POST", "POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"},
		{"chunked POST", "POST /hang HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{"upgrade", "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
				untilEOF(c, br) // reads all, answers nothing
			})
			f := startFrontConfig(t, &be.backendServer, false, ingress.Config{ResponseHeaderTimeout: 300 * time.Millisecond})
			start := time.Now()
			resp, body, err := rawDo(t, f, tc.req, nil)
			if err != nil || resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "--ingress-response-timeout") {
				t.Fatalf("got %v %q %v, want a 504 naming the flag", resp, body, err)
			}
			if took := time.Since(start); took < 300*time.Millisecond {
				t.Fatalf("a 504 after %s, before the timeout", took)
			}
			waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == be.opened.Load() })
		})
	}
}

// The response-header timeout times the head only, from the end of the
// request's body: an upload slower than it, a server that answers before
// it has read the body, and an answer whose body comes slowly (a stream)
// all pass whole.
func TestForwarderResponseHeaderTimeoutSparesStreams(t *testing.T) {
	const timeout = time.Second // wide: a loaded machine stalls for 100s of ms
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		head, err := readHead(br)
		if err != nil {
			return
		}
		switch {
		case strings.HasPrefix(head, "GET /stream"):
			// The head at once, then the body for 4 timeouts' time.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range 8 {
				fmt.Fprintf(c, "2\r\n%02d\r\n", i)
				time.Sleep(timeout / 2) // the stream's own pace
			}
			io.WriteString(c, "0\r\n\r\n")
		case strings.HasPrefix(head, "POST /early"):
			// Answers before the body, then reads it on for the client's
			// slow upload while it sends its answer's body slowly.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			buf := make([]byte, 1)
			for i := range 6 {
				if _, err := io.ReadFull(br, buf); err != nil {
					return
				}
				fmt.Fprintf(c, "1\r\n%d\r\n", i)
			}
			io.WriteString(c, "0\r\n\r\n")
		case strings.HasPrefix(head, "POST /slow"):
			// Reads the whole slow upload (6 bytes), then answers.
			if _, err := io.ReadFull(br, make([]byte, 6)); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		untilEOF(c, br)
	})
	f := startFrontConfig(t, &be.backendServer, false, ingress.Config{ResponseHeaderTimeout: timeout})
	t.Run("a slow stream", func(t *testing.T) {
		resp, body, err := rawDo(t, f, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", nil)
		if err != nil || resp.StatusCode != 200 || body != "0001020304050607" {
			t.Fatalf("got %v %q %v", resp, body, err)
		}
	})
	trickle := func(c net.Conn) {
		for range 6 {
			time.Sleep(timeout / 2) // the client's own pace
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
	}
	for _, path := range []string{"/slow", "/early"} {
		t.Run("a slow upload to "+path, func(t *testing.T) {
			resp, body, err := rawDo(t, f, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n", trickle)
			want := map[string]string{"/slow": "ok", "/early": "012345"}[path]
			if err != nil || resp.StatusCode != 200 || body != want {
				t.Fatalf("got %v %q %v, want 200 %q", resp, body, err, want)
			}
		})
	}
}

// A client that stops sending its request body gets a 408 at the body
// idle timeout, and the sandbox connection is closed; one that trickles
// its body with gaps under the timeout is served.
func TestForwarderBodyIdleTimeout(t *testing.T) {
	const idle = time.Second // wide: a loaded machine stalls for 100s of ms
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "%d:%s", len(b), b)
	}))
	f := startFrontConfig(t, be, false, ingress.Config{BodyIdleTimeout: idle})
	for _, tc := range []struct{ name, req string }{
		{"upgrade", "POST /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\nten bytes."},
		{"known length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nten bytes."},
		{"chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\na\r\nten bytes.\r\n"},
	} {
		t.Run("stalled "+tc.name, func(t *testing.T) {
			resp, body, err := rawDo(t, f, tc.req, nil)
			if err != nil || resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, "--ingress-body-timeout") {
				t.Fatalf("got %v %q %v, want a 408 naming the flag", resp, body, err)
			}
			waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == be.opened.Load() })
		})
	}
	t.Run("trickled", func(t *testing.T) {
		resp, body, err := rawDo(t, f, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", func(c net.Conn) {
			for _, b := range "hello" {
				time.Sleep(idle / 5) // the client's own pace
				io.WriteString(c, string(b))
			}
		})
		if err != nil || resp.StatusCode != 200 || body != "5:hello" {
			t.Fatalf("got %v %q %v", resp, body, err)
		}
	})
	// Past the body, the timeout is off: the answer to a request whose
	// body came whole may take longer (the server's background read of
	// the client connection must not end it).
	t.Run("answer after the body", func(t *testing.T) {
		slow := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			time.Sleep(2 * idle) // a slow answer's own pace
			io.WriteString(w, "b")
		}))
		f := startFrontConfig(t, slow, false, ingress.Config{BodyIdleTimeout: idle})
		resp, body, err := rawDo(t, f, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", nil)
		if err != nil || resp.StatusCode != 200 || body != "ab" {
			t.Fatalf("got %v %q %v", resp, body, err)
		}
	})
}

// A client's declared trailers reach the sandbox (they used to be
// declared and never sent); undeclared ones, the traffic token and fields
// a trailer must not carry do not.
func TestForwarderRequestTrailers(t *testing.T) {
	got := make(chan http.Header, 1)
	be := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		got <- r.Trailer
	}))
	f := startFront(t, be, false)
	resp, body, err := rawDo(t, f, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"+
		"Trailer: X-Sum, X-Clade-Traffic-Token, Host, X-Forwarded-For, Cookie\r\n\r\n5\r\nhello\r\n0\r\n"+
		"X-Sum: 42\r\nX-Undeclared: 1\r\nX-Clade-Traffic-Token: secret\r\nHost: evil\r\n"+
		"X-Forwarded-For: 10.0.0.1\r\nCookie: clade-signed=1.abc\r\n\r\n", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v %q %v", resp, body, err)
	}
	tr := <-got
	if tr.Get("X-Sum") != "42" || len(tr) != 1 {
		t.Fatalf("the sandbox got trailers %v, want only X-Sum: 42", tr)
	}
}

// Trailers are bounded both ways, as heads are: a client's endless trailer
// is a 400 (the sandbox has not answered yet); a sandbox's ends the
// answer cut (its head is long sent), and closes its connection.
func TestForwarderEndlessTrailers(t *testing.T) {
	t.Run("from the client", func(t *testing.T) {
		be := startRaw(t, func(c net.Conn, br *bufio.Reader) { untilEOF(c, br) })
		f := startFront(t, &be.backendServer, false)
		resp, body, err := rawDo(t, f, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", func(c net.Conn) {
			line := "X-Junk: " + strings.Repeat("j", 1000) + "\r\n"
			for range 1 << 14 {
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		})
		if err != nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "trailer") {
			t.Fatalf("got %v %q %v, want a 400 about the trailer", resp, body, err)
		}
		waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == be.opened.Load() })
	})
	t.Run("from the sandbox", func(t *testing.T) {
		var sent atomic.Int64
		be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := readHead(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Junk\r\n\r\n2\r\nhi\r\n0\r\n")
			line := "X-Junk: " + strings.Repeat("j", 1000) + "\r\n"
			c.SetWriteDeadline(time.Now().Add(15 * time.Second))
			for sent.Load() < 1<<30 {
				n, err := io.WriteString(c, line)
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
		f := startFront(t, &be.backendServer, false)
		if _, _, err := rawGet(t, f, "/"); err == nil {
			t.Fatal("an answer with an endless trailer reached the client as a whole one")
		}
		waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == 1 })
		if n := sent.Load(); n > 64<<20 {
			t.Fatalf("the proxy read %d bytes of trailer", n)
		}
	})
}

// The upgrade way takes a sandbox's broken answers as the forwarder does:
// a status under 100, an endless head, a 101 that switches to another
// protocol than asked are 502s, never a panic or a hang.
func TestUpgradeBrokenAnswers(t *testing.T) {
	for _, tc := range []struct{ name, answer string }{
		{"status 099", "HTTP/1.1 099 odd\r\nContent-Length: 0\r\n\r\n"},
		{"status +99", "HTTP/1.1 +99 odd\r\nContent-Length: 0\r\n\r\n"},
		{"101 to another protocol", "HTTP/1.1 101 Switching\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"},
		{"101 with no protocol", "HTTP/1.1 101 Switching\r\nConnection: Upgrade\r\n\r\n"},
		{"endless head", "HTTP/1.1 101 Switching\r\n" + strings.Repeat("X-Junk: "+strings.Repeat("j", 1000)+"\r\n", 1200)},
		{"garbage", "SSH-2.0-OpenSSH\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
				if _, err := readHead(br); err != nil {
					return
				}
				io.WriteString(c, tc.answer)
				untilEOF(c, br)
			})
			f := startFront(t, &be.backendServer, false)
			resp, body, err := rawDo(t, f, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", nil)
			if err != nil || resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("got %v %.200q %v, want a 502", resp, body, err)
			}
			waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == be.opened.Load() })
		})
	}
}

// One sandbox gets at most MaxConnsPerSandbox connections from the proxy
// at once, forwarded and upgraded alike: one more is a 503 with
// Retry-After, and the places come back as connections close.
func TestForwarderConnCap(t *testing.T) {
	release := make(chan struct{})
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		head, err := readHead(br)
		if err != nil {
			return
		}
		if strings.Contains(head, "Upgrade: websocket") {
			io.WriteString(c, "HTTP/1.1 101 Switching\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		} else {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
		}
		<-release
	})
	f := startFrontConfig(t, &be.backendServer, false, ingress.Config{MaxConnsPerSandbox: 2})
	addr := strings.TrimPrefix(f.url, "http://")
	var clients []net.Conn
	open := func(req string) (net.Conn, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, req)
		line, _ := bufio.NewReader(c).ReadString('\n')
		return c, line
	}
	get := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	ws := "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	c1, l1 := open(get)
	_, l2 := open(ws)
	if !strings.Contains(l1, " 200 ") || !strings.Contains(l2, " 101 ") {
		t.Fatalf("under the cap: %q %q", l1, l2)
	}
	for _, req := range []string{get, ws} {
		resp, body, err := rawDo(t, f, req, nil)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "--ingress-max-conns") {
			t.Fatalf("over the cap: %v %q %v, want a 503 with Retry-After", resp, body, err)
		}
	}
	if n := f.p.OpenConns("sb"); n != 2 {
		t.Fatalf("%d sandbox connections counted, want 2", n)
	}
	c1.Close()
	waitFor(t, "a place under the cap", func() bool { return f.p.OpenConns("sb") == 1 })
	if _, l := open(get); !strings.Contains(l, " 200 ") {
		t.Fatalf("after a close: %q", l)
	}
	close(release)
	for _, c := range clients {
		c.Close() // a tunnel lasts until both ends close
	}
	waitFor(t, "every place back", func() bool { return f.p.OpenConns("sb") == 0 })
}

// A sandbox's answer head of many tiny header lines (~20 bytes of the
// daemon's memory per byte) is a 502 past the line cap, on both ways;
// one under it passes.
func TestHeadLineCap(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lines   int
		upgrade bool
		want    int
	}{
		{"forward/1500", 1500, false, 200},
		{"forward/3000", 3000, false, http.StatusBadGateway},
		{"upgrade/1500", 1500, true, http.StatusSwitchingProtocols},
		{"upgrade/3000", 3000, true, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
				if _, err := readHead(br); err != nil {
					return
				}
				status := "200 OK\r\nContent-Length: 2"
				if tc.upgrade {
					status = "101 Switching\r\nConnection: Upgrade\r\nUpgrade: websocket"
				}
				io.WriteString(c, "HTTP/1.1 "+status+"\r\n"+strings.Repeat("a:b\r\n", tc.lines)+"\r\nok")
				untilEOF(c, br)
			})
			f := startFront(t, &be.backendServer, false)
			req := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
			if tc.upgrade {
				req = "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
			}
			c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != tc.want {
				t.Fatalf("got %v %v, want %d", resp, err, tc.want)
			}
		})
	}
}

// A client that stops reading (its window full, ACKing the kernel's
// probes) is dropped at the send timeout, and its sandbox connection
// closed: it held the request, and the sandbox awake, for ever.
func TestForwarderClientStopsReading(t *testing.T) {
	var stuck atomic.Int64
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
		buf := make([]byte, 1<<20)
		for {
			c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Write(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					stuck.Add(1) // the proxy takes no more: it is stuck on the client
					continue
				}
				return // the proxy closed it
			}
		}
	})
	f := startFrontConfig(t, &be.backendServer, false, ingress.Config{SendTimeout: time.Second})
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10)
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	// Reads nothing, keeps the connection open.
	deadline := time.Now().Add(60 * time.Second)
	for be.closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox connection is still open %s after the client stopped reading (stuck %d times)", time.Minute, stuck.Load())
		}
		time.Sleep(50 * time.Millisecond) // polling a counter
	}
	if stuck.Load() == 0 {
		t.Fatal("the sandbox never waited on the client: the test did not fill the client's window")
	}
}

// A sandbox that sends informational answers without end gets a 502 after
// a few, not a request held (and 1xx answers sent to the client) until the
// response-header timeout.
func TestForwarderEndless1xx(t *testing.T) {
	be := startRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(15 * time.Second))
		for {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"); err != nil {
				return
			}
		}
	})
	f := startFront(t, &be.backendServer, false)
	resp, body, err := rawDo(t, f, "GET / HTTP/1.0\r\nHost: x\r\n\r\n", nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "informational") {
		t.Fatalf("got %v %q %v, want a 502", resp, body, err)
	}
	waitFor(t, "the sandbox connection to close", func() bool { return be.closed.Load() == 1 })
}
