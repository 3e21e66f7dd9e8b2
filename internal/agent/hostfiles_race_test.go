package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestWriteHostFilesRacingFIFO: a process in the sandbox that keeps
// swapping a FIFO and a regular file at /etc/hostname and /etc/hosts
// while the agent rewrites them (a wake sends the hostname again) must
// not make the agent block in an open of the FIFO: it does that on its
// read loop, and a wake waiting for its answer would hold the sandbox for
// ever.
func TestWriteHostFilesRacingFIFO(t *testing.T) {
	a := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	etc := t.TempDir()
	a.cfg.Etc = etc
	a.writeHostFiles("box")
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, name := range []string{"hostname", "hosts"} {
				p := filepath.Join(etc, name)
				fifo := filepath.Join(etc, ".f"+name)
				_ = os.Remove(fifo)
				if syscall.Mkfifo(fifo, 0o644) != nil {
					continue
				}
				_ = os.Rename(fifo, p) // a FIFO at the path ...
				_ = os.WriteFile(fifo+"r", []byte(hostsMarker), 0o644)
				_ = os.Rename(fifo+"r", p) // ... and a regular file again
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3000 {
			a.writeHostFiles("box")
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		close(stop)
		<-swapped
		// Let the blocked open go: a writer on each path there is.
		for _, p := range []string{filepath.Join(etc, "hostname"), filepath.Join(etc, "hosts")} {
			if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
		t.Fatal("writeHostFiles blocked opening a FIFO swapped in at /etc/hostname or /etc/hosts")
	}
	close(stop)
	<-swapped
}
