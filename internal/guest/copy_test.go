package guest_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/guest"
)

// TestCopyRoundTrip pushes a file of several windows (the bulk window,
// widened by each end as a transfer opens, and the pooled frame buffers)
// through the real agent and pulls it back: the bytes must survive both
// ways intact.
func TestCopyRoundTrip(t *testing.T) {
	g := agentConn(t)
	dir := t.TempDir()
	data := make([]byte, 19<<20+12345) // not a multiple of any frame or window
	_, _ = rand.Read(data)
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	if err := tw.WriteHeader(&tar.Header{Name: "big.bin", Mode: 0o640, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write(data)
	_ = tw.Close()
	// A reader that hands over small pieces, as an HTTP body does.
	if err := g.CopyIn(t.Context(), dir, io.LimitReader(smallReads{&archive}, int64(archive.Len()))); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "big.bin"))
	if err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("pushed file: %d bytes (want %d), err %v, same: %v", len(got), len(data), err, bytes.Equal(got, data))
	}
	rc, err := g.CopyOut(context.Background(), filepath.Join(dir, "big.bin"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var pulled bytes.Buffer
	if _, err := io.Copy(&pulled, rc); err != nil { // WriteTo: payloads handed over uncopied
		t.Fatal(err)
	}
	tr := tar.NewReader(&pulled)
	h, err := tr.Next()
	if err != nil || h.Name != "big.bin" || h.Size != int64(len(data)) {
		t.Fatalf("pulled archive: %+v, %v", h, err)
	}
	back, err := io.ReadAll(tr)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("pulled %d bytes (want %d), err %v", len(back), len(data), err)
	}
}

// smallReads returns at most 32 KiB a read.
type smallReads struct{ r io.Reader }

func (s smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), 32<<10)]) }

// TestExecDuringPush runs execs on the connection a push saturates (an
// endless archive, its window always full): each must finish while the
// push still runs, not wait behind its frames.
func TestExecDuringPush(t *testing.T) {
	trueBin, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1)")
	}
	g := agentConn(t)
	dir := t.TempDir()
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		chunk := make([]byte, 1<<20)
		for i := 0; ; i++ {
			if err := tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(len(chunk)), Typeflag: tar.TypeReg}); err != nil {
				return
			}
			if _, err := tw.Write(chunk); err != nil {
				return
			}
		}
	}()
	pushed := make(chan error, 1)
	go func() { pushed <- g.CopyIn(t.Context(), dir, pr) }()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for i := range 20 {
		p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{trueBin}})
		if err != nil {
			t.Fatalf("exec %d during a push: %v", i, err)
		}
		st, err := p.Wait(ctx)
		p.Close()
		if err != nil || st.Code != 0 {
			t.Fatalf("exec %d during a push: %+v, %v", i, st, err)
		}
		select {
		case err := <-pushed:
			t.Fatalf("the endless push ended: %v", err)
		default:
		}
	}
	// A source that fails mid-archive (a client gone) ends the push with
	// its error, rather than leaving the agent waiting for the rest.
	gone := errors.New("client gone")
	pw.CloseWithError(gone)
	select {
	case err := <-pushed:
		if !errors.Is(err, gone) {
			t.Fatalf("push whose source failed: %v, want its error", err)
		}
	case <-ctx.Done():
		t.Fatal("a push whose source failed mid-archive never ended")
	}
}
