package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// veth is a PortDialer hook that reaches every sandbox's ports at one
// loopback listener (a sandbox's own address, in the real network hook).
type veth struct {
	*recordingHook
	addr string
}

func (v *veth) DialPort(ctx context.Context, _ string, _ int) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "tcp", v.addr)
}

// TestSleepClosesDialedConnections: a connection dialed to a sandbox's
// port over its own network is closed when the sandbox goes to sleep (or
// away), so its client sees an EOF and dials again (which wakes it),
// instead of waiting on a connection nobody will ever answer; those the
// client closed are not kept.
func TestSleepClosesDialedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The "server" accepts and never answers, as a frozen sandbox's.
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	defer func() { ln.Close(); <-accepted }()
	e := newEnv(t, Config{Hooks: []Hook{&veth{recordingHook: &recordingHook{}, addr: ln.Addr().String()}}})
	sb := e.create(t, 128)
	tr := e.m.Traffic()
	var conns []net.Conn
	for range 3 {
		c, err := tr.DialWaking(t.Context(), sb.ID, 8080)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	conns[0].Close()
	conns[1].Close()
	c, err := tr.DialWaking(t.Context(), sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	open := []net.Conn{conns[2], c}
	tr.mu.Lock()
	n := 0
	for _, cs := range tr.dialed {
		n += len(cs)
	}
	tr.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d connections kept, want the 2 still open", n)
	}
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	for i, c := range open {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if errors.Is(err, os.ErrDeadlineExceeded) || err == nil || (!errors.Is(err, net.ErrClosed) && err != io.EOF) {
			t.Fatalf("connection %d after the sleep: read %v, want it closed", i, err)
		}
	}
	// A new dial wakes it, and a removal closes that one too.
	c, err = tr.DialWaking(t.Context(), sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after the removal: read %v, want it closed", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.dialed) != 0 {
		t.Fatalf("connections of gone sandboxes kept: %v", tr.dialed)
	}
}
