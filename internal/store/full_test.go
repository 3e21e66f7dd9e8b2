package store

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestFullDiskIsResourceExhausted checks that a write the full disk refuses
// says so with a ResourceExhausted error (a retryable 429), not an internal
// "database or disk is full (13)", as the chaos soak saw creates fail.
func TestFullDiskIsResourceExhausted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir, s := storeOnTmpfs(t, "2m")
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

// TestRemovalOnAFullDiskUsesTheReserve: on a full disk a create is refused
// (ResourceExhausted), but the removal that would free space goes through
// (the reserve beside the database is given up for it), and the reserve
// comes back once there is room.
func TestRemovalOnAFullDiskUsesTheReserve(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir, s := storeOnTmpfs(t, "80m")
	if _, err := os.Stat(filepath.Join(dir, "clade.db.reserve")); err != nil {
		t.Fatalf("no reserve beside the database: %v", err)
	}
	if err := s.InsertSandbox(t.Context(), Sandbox{ID: "victim", Image: "default", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	fill := func() {
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
		small := make([]byte, 512)
		for {
			if _, err := f.Write(small); err != nil {
				return
			}
		}
	}
	fill()
	big := make([]string, 256)
	for i := range big {
		big[i] = string(make([]byte, 1024))
	}
	// Writes that do not free space are refused: fill what the WAL has.
	refused := false
	for i := range 2000 {
		if err := s.InsertSandbox(t.Context(), Sandbox{ID: fmt.Sprintf("new%d", i), Image: "default", State: StateCreating, Env: big}); err != nil {
			if !errdefs.Is(err, errdefs.ResourceExhausted) {
				t.Fatalf("create on a full disk: %v", err)
			}
			refused = true
			break
		}
	}
	if !refused {
		t.Fatal("creates never filled the disk")
	}
	if err := s.Transition(t.Context(), "victim", StateRunning, StateDestroying, ""); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("a removal's write outside ForCleanup on a full disk: %v, want ResourceExhausted", err)
	}
	ctx := ForCleanup(t.Context())
	if err := s.Transition(ctx, "victim", StateRunning, StateDestroying, ""); err != nil {
		t.Fatalf("a removal on a full disk with the reserve: %v", err)
	}
	if err := s.DeleteSandbox(ctx, "victim"); err != nil {
		t.Fatalf("deleting the record on a full disk with the reserve: %v", err)
	}
	if _, err := s.GetSandbox(t.Context(), "victim"); !errdefs.IsNotFound(err) {
		t.Fatalf("the removed record: %v", err)
	}
	// Room again: the reserve is made again after a write.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s.reserve.mu.Lock()
	s.reserve.lastTried = time.Time{} // not 30 s of waiting in a test
	s.reserve.mu.Unlock()
	if err := s.InsertSandbox(t.Context(), Sandbox{ID: "after", Image: "default", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "clade.db.reserve")); err != nil {
		t.Fatalf("the reserve was not made again once there was room: %v", err)
	}
}

// storeOnTmpfs opens a store on a tmpfs of the given size of its own.
func storeOnTmpfs(t *testing.T, size string) (string, *Store) {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	s, err := Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return dir, s
}
