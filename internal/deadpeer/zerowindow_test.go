package deadpeer_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/deadpeer"
)

// TestSlowReaderNotCut: a peer that stops reading (its receive window
// closes, its kernel still answers every zero-window probe) is slow, not
// dead: a connection with a dead-peer time outlasts it, accepted (the
// daemon streaming an exec's output to a paused client) or dialed (a
// client uploading to a daemon that reads slowly). With TCP_USER_TIMEOUT
// Linux closed both after the dead-peer time.
func TestSlowReaderNotCut(t *testing.T) {
	const dead = 2 * time.Second
	for _, side := range []string{"accepted", "dialed"} {
		t.Run(side, func(t *testing.T) {
			var ln net.Listener
			var err error
			if side == "accepted" {
				ln, err = deadpeer.NewListenConfig(dead).Listen(t.Context(), "tcp", "127.0.0.1:0")
			} else {
				ln, err = net.Listen("tcp", "127.0.0.1:0")
			}
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var dialed net.Conn
			if side == "accepted" {
				dialed, err = net.Dial("tcp", ln.Addr().String())
			} else {
				dialed, err = deadpeer.NewDialer(5*time.Second, dead).Dial("tcp", ln.Addr().String())
			}
			if err != nil {
				t.Fatal(err)
			}
			defer dialed.Close()
			accepted, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer accepted.Close()
			writer, reader := accepted, dialed
			if side == "dialed" {
				writer, reader = dialed, accepted
			}
			const total = 64 << 20
			werr := make(chan error, 1)
			go func() {
				buf := make([]byte, 64<<10)
				var n int
				for n < total {
					m, err := writer.Write(buf)
					n += m
					if err != nil {
						werr <- err
						return
					}
				}
				werr <- writer.Close()
			}()
			// The reader stalls for 4 dead-peer times with its window closed.
			select {
			case err := <-werr:
				t.Fatalf("the writer ended before the reader read: %v", err)
			case <-time.After(4 * dead):
			}
			n, err := io.Copy(io.Discard, reader)
			if n != total || err != nil {
				t.Errorf("a reader that paused %s with a dead-peer time of %s got %d of %d bytes: %v (writer: %v)", 4*dead, dead, n, total, err, <-werr)
			}
		})
	}
}
