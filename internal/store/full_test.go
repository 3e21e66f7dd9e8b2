package store

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestFullDiskIsResourceExhausted checks that a write the full disk refuses
// says so with a ResourceExhausted error (a retryable 429), not an internal
// "database or disk is full (13)", as the chaos soak saw creates fail.
func TestFullDiskIsResourceExhausted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	s, err := Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Take the rest of the file system.
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	big := make([]string, 64)
	for i := range big {
		big[i] = string(make([]byte, 1024))
	}
	for i := 0; ; i++ {
		err := s.InsertSandbox(t.Context(), Sandbox{ID: string(rune('a'+i%26)) + string(rune('a'+i/26)), Image: "default", State: StateRunning, Env: big})
		if err == nil {
			if i > 1000 {
				t.Fatal("1000 inserts fit on a full 2 MiB disk")
			}
			continue
		}
		if !errdefs.Is(err, errdefs.ResourceExhausted) {
			t.Fatalf("insert on a full disk: %v (class %s), want ResourceExhausted", err, errdefs.ClassOf(err))
		}
		break
	}
	// The image records' writes too (a soak saw a build's commit fail
	// with an internal "database or disk is full" from one of them).
	root := string(make([]byte, 8192))
	for i := 0; ; i++ {
		err := s.AddImageRoot(t.Context(), root+string(rune('a'+i%26))+string(rune('a'+i/26)))
		if err == nil {
			if i > 1000 {
				t.Fatal("1000 image roots fit on a full 2 MiB disk")
			}
			continue
		}
		if !errdefs.Is(err, errdefs.ResourceExhausted) {
			t.Fatalf("image root on a full disk: %v (class %s), want ResourceExhausted", err, errdefs.ClassOf(err))
		}
		break
	}
	_, _, err = s.PutImage(t.Context(), Image{Name: "big", RootFS: root, Source: root})
	if !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("image on a full disk: %v (class %s), want ResourceExhausted", err, errdefs.ClassOf(err))
	}
}
