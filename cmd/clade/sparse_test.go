package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSparseWriter: what is written reads back byte for byte, in writes
// of any size, and zero chunks take no disk (a trailing one included).
func TestSparseWriter(t *testing.T) {
	var want []byte
	data := make([]byte, 3*sparseChunk+123)
	_, _ = rand.Read(data)
	want = append(want, data...)
	want = append(want, make([]byte, 64*sparseChunk)...) // 4 MiB of zeros
	want = append(want, data[:777]...)
	want = append(want, make([]byte, 16*sparseChunk+5)...) // a trailing hole
	p := filepath.Join(t.TempDir(), "out")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := newSparseWriter(f)
	for rest, i := want, 1; len(rest) > 0; i = i*7%100003 + 1 {
		k := min(i, len(rest))
		if n, err := w.Write(rest[:k]); n != k || err != nil {
			t.Fatalf("write %d: %d, %v", k, n, err)
		}
		rest = rest[k:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if alloc := st.Blocks * 512; alloc > int64(len(want))/4 {
		t.Fatalf("%d bytes allocated for a file of %d, mostly zeros: not sparse", alloc, len(want))
	}
}
