package gvisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestDirectCheckpoint: with the runsc `make deps` builds, checkpoints go
// through the control socket (a runsc version bump that changes the
// version string fails here, not silently in the benchmarks); the image
// restores with what the parent wrote, and the parent runs on.
func TestDirectCheckpoint(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	e, err := New(Config{StateDir: filepath.Join(dir, "state"), Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if !e.direct(t.Context()) {
		t.Fatalf("runsc %q does not take direct checkpoints: add its version to directVersions once its control.SaveOpts is checked", e.RunscVersion(t.Context()))
	}
	spec := engine.Spec{ID: "ctl0000000000001", RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 128, Hostname: "c"}
	sb, err := e.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), spec.ID) })
	if r := enginetest.Exec(t, sb, "sh", "-c", "echo before > /tmp/mark && cat /tmp/mark"); r.Stdout != "before\n" {
		t.Fatalf("write: %+v", r)
	}
	img := filepath.Join(dir, "img")
	if err := e.Checkpoint(t.Context(), spec.ID, img, true); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		if fi, err := os.Stat(filepath.Join(img, name)); err != nil || fi.Size() == 0 {
			t.Fatalf("image file %s: %v", name, err)
		}
	}
	if r := enginetest.Exec(t, sb, "cat", "/tmp/mark"); r.Stdout != "before\n" {
		t.Fatalf("the parent after its checkpoint: %+v", r)
	}
	child := spec
	child.ID = "ctl0000000000002"
	sb2, err := e.Restore(t.Context(), child, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), child.ID) })
	if r := enginetest.Exec(t, sb2, "cat", "/tmp/mark"); r.Stdout != "before\n" {
		t.Fatalf("the restored copy reads %+v", r)
	}

	// A second checkpoint into the same directory fails (runsc's files are
	// made exclusively) and leaves the sandbox running.
	if err := e.Checkpoint(t.Context(), spec.ID, img, true); err == nil {
		t.Fatal("a checkpoint over an existing image succeeded")
	}
	if r := enginetest.Exec(t, sb, "cat", "/tmp/mark"); r.Stdout != "before\n" {
		t.Fatalf("the parent after a failed checkpoint: %+v", r)
	}
}
