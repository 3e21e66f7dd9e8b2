package tarx

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestExtractOutOfInodes checks that a filesystem out of inodes (the create
// of a file or of a parent directory fails with ENOSPC, before any byte is
// written) is a ResourceExhausted error saying what to do, as a full disk
// is, not an unclassified one the API turns into a 500.
func TestExtractOutOfInodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	for _, tc := range []struct {
		name string
		make func(i int) string
	}{
		{"files", func(i int) string { return fmt.Sprintf("f%d", i) }},
		{"parents", func(i int) string { return fmt.Sprintf("d%d/f", i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m,nr_inodes=16"); err != nil {
				t.Fatalf("mount tmpfs: %v", err)
			}
			t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
			var es []entry
			for i := range 64 {
				es = append(es, entry{name: tc.make(i), body: "x"})
			}
			err := Extract(dir, bytes.NewReader(archive(t, es...)), Options{})
			if !errdefs.Is(err, errdefs.ResourceExhausted) {
				t.Fatalf("64 files into 16 inodes: %v (class %s), want a ResourceExhausted error", err, errdefs.ClassOf(err))
			}
		})
	}
}

