package tarx

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// TestCreateFileSwappedForFIFO checks that a pull whose regular file is
// swapped for a FIFO between the walk's Lstat and the open skips it rather
// than hanging in open(2) until some writer comes (forever, in a sandbox).
func TestCreateFileSwappedForFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var buf bytes.Buffer
	go func() { done <- add(tar.NewWriter(&buf), p, "f", fi) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("add of a file swapped for a FIFO: %v, want it skipped", err)
		}
	case <-time.After(10 * time.Second):
		// Let the open return so the goroutine ends.
		if w, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatal("add of a file swapped for a FIFO hung in open")
	}
}

// TestExtractRacingSwapper races an extraction into d/ against a process
// that keeps replacing d with a symlink to a directory outside the root and
// back (the kept parent directory descriptor must never lead outside), and
// checks that nothing lands outside.
func TestExtractRacingSwapper(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "d")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var stop atomic.Bool
	swaps := make(chan int)
	go func() {
		n := 0
		d, moved := filepath.Join(root, "d"), filepath.Join(root, "moved")
		for !stop.Load() {
			if os.Rename(d, moved) == nil {
				_ = os.Symlink(outside, d)
				n++
				_ = os.Remove(d)
				_ = os.Rename(moved, d)
			}
		}
		swaps <- n
	}()
	var es []entry
	for i := range 3000 {
		es = append(es, entry{name: fmt.Sprintf("d/f%d", i), body: "x"})
		if i%100 == 0 {
			es = append(es, entry{typ: tar.TypeLink, name: fmt.Sprintf("d/h%d", i), link: fmt.Sprintf("d/f%d", i)})
		}
	}
	a := archive(t, es...)
	for range 5 {
		_ = Extract(root, bytes.NewReader(a), Options{})
	}
	stop.Store(true)
	if n := <-swaps; n == 0 {
		t.Fatal("the swapper never swapped")
	}
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) > 0 {
		t.Fatalf("%d entries landed outside the root, first %s", len(ents), ents[0].Name())
	}
}

// TestExtractKeptDirReplaced checks entries that go into a directory the
// extraction keeps open after the archive replaced it: with a file, then
// with a new directory of the same name.
func TestExtractKeptDirReplaced(t *testing.T) {
	root := t.TempDir()
	err := Extract(root, bytes.NewReader(archive(t,
		entry{name: "a/f", body: "1"},
		entry{name: "a", body: "file"},
		entry{typ: tar.TypeDir, name: "a/", mode: 0o755},
		entry{name: "a/g", body: "2"},
		entry{name: "a/g", body: "3"},
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "a/g")); err != nil || string(b) != "3" {
		t.Fatalf("a/g = %q, %v; want the last duplicate, 3", b, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "a/f")); !os.IsNotExist(err) {
		t.Fatalf("a/f survived its directory's replacement: %v", err)
	}
	_ = io.Discard
}
