package ingress_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/sdk"
)

// TestIngressHostileClient plays a client that pipelines requests for two
// sandboxes on one connection, with and without their tokens, smuggles a
// request in a body, and aborts connections by the hundred: each request
// is routed and authorized on its own, and the daemon gets its
// descriptors back.
func TestIngressHostileClient(t *testing.T) {
	d := startDaemon(t)
	c := d.Client
	ctx := context.Background()
	a, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "atk-a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "atk-b"})
	if err != nil {
		t.Fatal(err)
	}
	startAppOn(t, c, a.ID, "0.0.0.0") // over the veth: TCP both sides
	startApp(t, c, b.ID)              // through the agent
	ta, tb := newTarget(t, a, appPort), newTarget(t, b, appPort)
	helloA, helloB := mustGet(t, ta, "/hello"), mustGet(t, tb, "/hello")
	hostA, hostB := strings.TrimPrefix(ta.base, "http://"), strings.TrimPrefix(tb.base, "http://")

	type step struct {
		req  string
		code int
		body string // a substring of the answer's body
		not  []string
	}
	get := func(path, host, token string, extra ...string) string {
		s := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n"
		if token != "" {
			s += ingress.TokenHeader + ": " + token + "\r\n"
		}
		for _, e := range extra {
			s += e + "\r\n"
		}
		return s + "\r\n"
	}
	steps := []step{
		{req: get("/hello", hostA, ta.token), code: 200, body: helloA},
		{req: get("/hello", hostB, ""), code: 403},
		{req: get("/hello", hostA, ""), code: 403},
		{req: get("/hello", hostB, ta.token), code: 403},
		{req: get("/hello", hostB, tb.token), code: 200, body: helloB},
		// A body that hides a request: Transfer-Encoding wins over
		// Content-Length, so the hidden request is a request of its own,
		// for B without a token: refused. The app reads an empty body
		// (its POST answers the bytes it read).
		{req: "POST /upload HTTP/1.1\r\nHost: " + hostA + "\r\n" + ingress.TokenHeader + ": " + ta.token + "\r\nContent-Length: 60\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", code: 200, body: "0"},
		{req: get("/inc", hostB, ""), code: 403},
		// Neither the token, nor the signed URL's query or cookie reach the app.
		{req: get("/headers", hostB, tb.token, "Cookie: app=1; "+ingress.CookieName+"=1.abc"), code: 200, body: "cookie: app=1", not: []string{tb.token, ingress.CookieName}},
		{req: get("/path?a=1&"+ingress.ExpiresParam+"=1&"+ingress.SignatureParam+"=abc", hostB, tb.token), code: 200, body: "/path?a=1", not: []string{"clade-"}},
		// The upgrade way takes the same rules: no token, another's.
		{req: get("/ws", hostB, "", "Connection: Upgrade", "Upgrade: echo"), code: 403},
		{req: get("/ws", hostB, ta.token, "Connection: Upgrade", "Upgrade: echo"), code: 403},
		// An absolute URI names the route (over Host), and is authorized
		// as that route: A's token does not open B.
		{req: "GET http://" + hostB + "/hello HTTP/1.1\r\nHost: " + hostA + "\r\n" + ingress.TokenHeader + ": " + ta.token + "\r\n\r\n", code: 403},
		{req: get("/hello", hostA, ta.token, "Connection: close"), code: 200, body: helloA},
	}
	conn, err := net.Dial("tcp", ta.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var all strings.Builder
	for _, s := range steps {
		all.WriteString(s.req)
	}
	if _, err := io.WriteString(conn, all.String()); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	for i, s := range steps {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("step %d: body: %v", i, err)
		}
		if resp.StatusCode != s.code || !strings.Contains(string(body), s.body) {
			t.Errorf("step %d (%.60q): %d %q, want %d with %q", i, s.req, resp.StatusCode, body, s.code, s.body)
		}
		for _, bad := range s.not {
			if strings.Contains(string(body), bad) {
				t.Errorf("step %d: the app saw %q: %s", i, bad, body)
			}
		}
	}
	if n, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after Connection: close: %v %v, want EOF", n, err)
	}

	// On the upgrade way too, neither the token nor the signed URL's
	// cookie reach the app (an app that answers an upgrade request 200).
	for _, tg := range []*target{ta, tb} {
		host := strings.TrimPrefix(tg.base, "http://")
		uc, err := net.Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(uc, get("/headers", host, tg.token, "Connection: Upgrade", "Upgrade: echo", "Cookie: app=1; "+ingress.CookieName+"=1.abc"))
		uc.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(uc), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		uc.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "upgrade: echo") || strings.Contains(string(body), tg.token) || strings.Contains(string(body), ingress.CookieName) {
			t.Errorf("an upgrade request reached the app as %d %q", resp.StatusCode, body)
		}
	}

	// Aborted connections by the hundred: the daemon's descriptors come back.
	fds := func() int {
		es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	mustGet(t, ta, "/hello")
	ta.hc.Transport.(*http.Transport).CloseIdleConnections()
	tb.hc.Transport.(*http.Transport).CloseIdleConnections()
	before := fds()
	aborts := []func(host, token string) string{
		func(host, _ string) string { return "GET /hello HTTP/1.1\r\nHost: " + host + "\r\n" }, // head cut
		func(host, token string) string { return get("/big?n=50000000", host, token) },         // read a little, go
		func(host, token string) string { return get("/hello", host, token) },                  // ask, go at once
		func(host, token string) string { // a body cut short
			return "POST /hello HTTP/1.1\r\nHost: " + host + "\r\n" + ingress.TokenHeader + ": " + token + "\r\nContent-Length: 1000\r\n\r\nabc"
		},
	}
	for i := range 200 {
		host, token := hostA, ta.token
		if i%2 == 1 {
			host, token = hostB, tb.token
		}
		cn, err := net.Dial("tcp", ta.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(cn, aborts[i%len(aborts)](host, token))
		if i%len(aborts) == 1 {
			cn.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.ReadFull(cn, make([]byte, 100<<10))
		}
		cn.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for n := fds(); n > before+4; n = fds() {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon holds %d descriptors, %d before 200 aborted connections", n, before)
		}
		time.Sleep(50 * time.Millisecond) // polling /proc
	}
	// And serves on.
	if got := mustGet(t, ta, "/hello"); got != helloA {
		t.Fatalf("after: %q", got)
	}
}
