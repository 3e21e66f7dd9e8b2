package ingress_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/sdk"
)

// TestIngressClientConnCaps plays a client with no token that opens
// hundreds of connections from one address (and more from a second) for a
// host that is no sandbox's: the ingress holds no more than its caps per
// address and in all (the rest are closed at accept), the daemon's
// descriptors stay within the caps, the API answers meanwhile, the
// refused client's connections are closed soon after their 404s rather
// than kept for the server's idle timeout, and a connection that carried
// a request to a sandbox is kept past that.
func TestIngressClientConnCaps(t *testing.T) {
	const total, perIP = 150, 100
	const fromA, fromB = 600, 100 // from 127.0.0.2, then 127.0.0.3
	d := startDaemon(t, "--ingress-max-client-conns", strconv.Itoa(total), "--ingress-max-client-conns-per-ip", strconv.Itoa(perIP))
	c := d.Client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "conncap"})
	if err != nil {
		t.Fatal(err)
	}
	startApp(t, c, sb.ID)
	tg := newTarget(t, sb, appPort)
	host := strings.TrimPrefix(tg.base, "http://")
	fds := func() int {
		es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	dial := func(src string) (net.Conn, error) {
		nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		cn, err := nd.Dial("tcp", tg.addr)
		if err == nil {
			t.Cleanup(func() { cn.Close() })
		}
		return cn, err
	}

	// A connection that carries a request to the sandbox, from 127.0.0.1;
	// it waits out the whole test idle.
	kept, err := dial("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	kbr := bufio.NewReader(kept)
	authed := "GET /hello HTTP/1.1\r\nHost: " + host + "\r\n" + ingress.TokenHeader + ": " + tg.token + "\r\n\r\n"
	keptGet := func(when string) {
		t.Helper()
		kept.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(kept, authed); err != nil {
			t.Fatalf("%s: the routed connection: %v", when, err)
		}
		resp, err := http.ReadResponse(kbr, nil)
		if err != nil {
			t.Fatalf("%s: the routed connection: %v", when, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: the routed connection got %d", when, resp.StatusCode)
		}
	}
	keptGet("first request")
	before := fds()

	// Each sends a request's head but its end: the ingress holds them all
	// (up to its ReadHeaderTimeout) while we look.
	type client struct {
		src string
		c   net.Conn
		br  *bufio.Reader
	}
	var clients []client
	refusedAtDial := 0
	for i := range fromA + fromB {
		src := "127.0.0.2"
		if i >= fromA {
			src = "127.0.0.3"
		}
		cn, err := dial(src)
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("dial %d from %s: %v", i, src, err)
			}
			refusedAtDial++ // closed at accept before the dial saw it open
			continue
		}
		// A write to one refused meanwhile may fail: its read tells below.
		io.WriteString(cn, "GET / HTTP/1.1\r\nHost: nosuch.example\r\n")
		clients = append(clients, client{src: src, c: cn, br: bufio.NewReader(cn)})
	}
	if n := fds(); n > before+total+30 {
		t.Errorf("the daemon holds %d descriptors with %d connections open to the ingress, %d before: over its cap of %d", n, fromA+fromB, before, total)
	}
	// The API answers while the ingress holds its most.
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.ListSandboxes(lctx)
	cancel()
	if err != nil || time.Since(start) > 3*time.Second {
		t.Errorf("listing sandboxes with the ingress full: %v after %s", err, time.Since(start))
	}

	// The end of every head: the admitted get their 404, the refused were
	// closed at accept (a reset, or EOF).
	admitted := map[string][]client{}
	for _, cl := range clients {
		cl.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(cl.c, "\r\n"); err != nil {
			continue // refused: closed already
		}
		resp, err := http.ReadResponse(cl.br, nil)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a connection from %s neither answered nor closed: %v", cl.src, err)
			}
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a request for no sandbox got %d", resp.StatusCode)
		}
		admitted[cl.src] = append(admitted[cl.src], cl)
	}
	// The routed connection counts in the total.
	if a, b := len(admitted["127.0.0.2"]), len(admitted["127.0.0.3"]); a != perIP || b != total-perIP-1 {
		t.Errorf("the ingress held %d connections from 127.0.0.2 and %d from 127.0.0.3 (%d refused at dial), want %d and %d", a, b, refusedAtDial, perIP, total-perIP-1)
	}

	// Idle after their 404s, with nothing routed on them: closed within
	// the short timeout, not kept for the server's idle timeout (90 s).
	for _, cls := range admitted {
		for _, cl := range cls {
			cl.c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := cl.br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("an idle connection with only refused requests on it: %v, want it closed", err)
			}
		}
	}
	// Idle all the while, the routed connection is open and serves on.
	keptGet("after the refused connections closed")
}

// TestUnroutedIdleClose: on the proxy's own server and listener (no
// sandbox service), a connection whose requests were all refused (a host
// that is no sandbox's) is closed soon after its last answer, and the
// connections over Config's cap per address are closed at accept.
func TestUnroutedIdleClose(t *testing.T) {
	p := ingress.New(ingress.Config{Domain: "test", MaxClientConnsPerIP: 2}, nil)
	srv := p.Server()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := p.Limit(ln)
	go srv.Serve(lim)
	t.Cleanup(func() { srv.Close(); p.Close() })

	var conns []net.Conn
	for range 2 {
		cn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cn.Close() })
		conns = append(conns, cn)
	}
	// The third from 127.0.0.1: closed at accept.
	if cn, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		cn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := cn.Read(make([]byte, 1))
		cn.Close()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a third connection from one address: read %v, want it closed", err)
		}
	}
	cn := conns[0]
	br := bufio.NewReader(cn)
	for range 2 { // two refused requests: neither marks the connection
		io.WriteString(cn, "GET / HTTP/1.1\r\nHost: nosuch.example\r\n\r\n")
		cn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || resp.Close {
			t.Fatalf("got %d (close %v), want a kept-alive 404", resp.StatusCode, resp.Close)
		}
	}
	start := time.Now()
	cn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle after refused requests: %v, want closed", err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("closed after %s idle", took)
	}
	// Its place is given back: another connection from the address is
	// served.
	waitFor(t, "the closed connection's place", func() bool { return lim.Open() == 1 })
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: nosuch.example\r\n\r\n")
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(c2), nil); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("after a place came back: %v", err)
	}
}
