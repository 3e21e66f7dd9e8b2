package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
)

// agentConn runs the real agent in this process, connected to a guest.Conn
// over a real unix socket. Its dials reach the host's loopback.
func agentConn(t testing.TB) *guest.Conn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := guest.NewConn()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_ = g.Serve(nc)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = agent.New(agent.Config{Socket: sock}).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		g.Close(nil)
		ln.Close()
		<-served
	})
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if err := g.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	return g
}

// listen serves each connection with serve on a loopback port.
func listen(t *testing.T, serve func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestDialEchoHalfCloseAndBulk(t *testing.T) {
	g := agentConn(t)
	// The server echoes until EOF, then says how much it got and closes.
	port := listen(t, func(c net.Conn) {
		n, _ := io.Copy(c, c)
		_, _ = io.WriteString(c, "\ntotal="+strconv.FormatInt(n, 10))
	})
	ctx := context.Background()
	conn, err := g.Dial(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 8 MiB: eight times the flow-control window, both ways at once.
	payload := make([]byte, 8<<20)
	_, _ = rand.Read(payload)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(payload)
		if err == nil {
			err = conn.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	want := append(append([]byte(nil), payload...), []byte("\ntotal="+strconv.Itoa(len(payload)))...)
	if !bytes.Equal(got, want) {
		t.Fatalf("echo: got %d bytes, want %d (tail %q)", len(got), len(want), got[max(0, len(got)-20):])
	}
	select {
	case <-conn.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("channel did not end after both directions closed")
	}
	if n := g.Active(); n != 0 {
		t.Errorf("Active = %d, want 0: port connections do not count", n)
	}
}

func TestDialRefusedAndBadPort(t *testing.T) {
	g := agentConn(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	_, err = g.Dial(context.Background(), port)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "nothing listens on port "+strconv.Itoa(port)) {
		t.Fatalf("dial a closed port: %v, want unavailable 'nothing listens'", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := g.Dial(context.Background(), p); errdefs.ClassOf(err) != errdefs.InvalidArgument {
			t.Errorf("dial port %d: %v, want invalid_argument", p, err)
		}
	}
}

func TestDialCloseEndsServerSide(t *testing.T) {
	g := agentConn(t)
	closed := make(chan error, 1)
	port := listen(t, func(c net.Conn) {
		_, _ = c.Write([]byte("hello"))
		_, err := io.Copy(io.Discard, c) // until the host's Close reaches it
		closed <- err
	})
	conn, err := g.Dial(context.Background(), port)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	conn.Close()
	select {
	case err := <-closed:
		if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Logf("server saw %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server's connection stayed open after Close")
	}
	if _, err := conn.Write([]byte("x")); err == nil {
		t.Error("write after Close succeeded")
	}
}
