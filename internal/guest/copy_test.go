package guest_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"testing"
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
