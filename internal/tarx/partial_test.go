package tarx

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestFailedFileLeavesNothing checks that a file whose extraction fails
// half way (a truncated upload, a full disk) is not left behind half
// written: the chaos soak found empty files after uploads that failed with
// ENOSPC.
func TestFailedFileLeavesNothing(t *testing.T) {
	archive := func(size int) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg})
		_, _ = tw.Write(bytes.Repeat([]byte{'x'}, size))
		_ = tw.Close()
		return b.Bytes()
	}
	t.Run("truncated", func(t *testing.T) {
		dir := t.TempDir()
		a := archive(100 << 10)
		err := Extract(dir, bytes.NewReader(a[:60<<10]), Options{})
		if err == nil {
			t.Fatal("a truncated archive extracted without an error")
		}
		if _, serr := os.Lstat(filepath.Join(dir, "f")); !os.IsNotExist(serr) {
			t.Fatalf("after %v: f is there (%v), want no half-written file", err, serr)
		}
	})
	t.Run("disk full", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to mount a small tmpfs")
		}
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"); err != nil {
			t.Fatalf("mount tmpfs: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
		err := Extract(dir, bytes.NewReader(archive(1<<20)), Options{})
		if !errdefs.Is(err, errdefs.ResourceExhausted) {
			t.Fatalf("extracting 1 MiB into 256 KiB: %v (class %s), want a ResourceExhausted error", err, errdefs.ClassOf(err))
		}
		if _, serr := os.Lstat(filepath.Join(dir, "f")); !os.IsNotExist(serr) {
			t.Fatalf("after %v: f is there (%v), want no half-written file", err, serr)
		}
	})
}
