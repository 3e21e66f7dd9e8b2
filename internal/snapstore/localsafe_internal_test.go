package snapstore

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLocalNoOpenat2NoSymlinkDir: where the kernel (or a seccomp filter)
// has no openat2, an object under a directory symlink planted in the store
// is still refused: the fallback opens each name of the path without
// following a symlink, not only the last one.
func TestLocalNoOpenat2NoSymlinkDir(t *testing.T) {
	for _, errno := range []error{unix.ENOSYS, unix.EPERM} {
		t.Run(errno.Error(), func(t *testing.T) {
			old := openat2
			openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, errno }
			t.Cleanup(func() { openat2 = old })
			outside := t.TempDir()
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("someone else's"), 0o600); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			l, err := NewLocal(root)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(root, "sha256-planted")); err != nil {
				t.Fatal(err)
			}
			f, err := l.openObject(filepath.Join(root, "sha256-planted", "secret"))
			if err == nil {
				f.Close()
				t.Fatal("an object under a directory symlink was opened (read outside the store)")
			}
			if !errors.Is(err, ErrNotRegular) {
				t.Fatalf("an object under a directory symlink: %v, want ErrNotRegular", err)
			}
			// A plain object still opens so.
			if err := os.MkdirAll(filepath.Join(root, "sha256-ok", "d"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "sha256-ok", "d", "obj"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err = l.openObject(filepath.Join(root, "sha256-ok", "d", "obj"))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if _, err := l.openObject(filepath.Join(root, "sha256-ok", "d", "none")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a missing object: %v, want not exist", err)
			}
		})
	}
}
