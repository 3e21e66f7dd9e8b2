package gvisor_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestMountRestoresElsewhere: a sandbox sees a host directory at a
// mount's destination; a checkpoint restored with another source at that
// destination sees the other directory, and its writes go there.
func TestMountRestoresElsewhere(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	e, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "state"), Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := engine.Spec{ID: "mnt0000000000001", RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 128, Hostname: "m",
		Mounts: []engine.Mount{{Source: a, Destination: "/data"}}}
	sb, err := e.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), spec.ID) })
	if r := enginetest.Exec(t, sb, "sh", "-c", "echo parent > /data/f && cat /data/f"); r.Stdout != "parent\n" {
		t.Fatalf("write in sandbox: %+v", r)
	}
	if got, _ := os.ReadFile(filepath.Join(a, "f")); string(got) != "parent\n" {
		t.Fatalf("host sees %q", got)
	}
	img := filepath.Join(dir, "img")
	if err := e.Checkpoint(t.Context(), spec.ID, img, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", a+"/.", b).CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	child := spec
	child.ID = "mnt0000000000002"
	child.Mounts = []engine.Mount{{Source: b, Destination: "/data"}}
	sb2, err := e.Restore(t.Context(), child, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), child.ID) })
	if r := enginetest.Exec(t, sb2, "sh", "-c", "cat /data/f && echo child > /data/f && sync"); r.Stdout != "parent\n" {
		t.Fatalf("restored child reads %+v", r)
	}
	if got, _ := os.ReadFile(filepath.Join(b, "f")); string(got) != "child\n" {
		t.Fatalf("child's source holds %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(a, "f")); string(got) != "parent\n" {
		t.Fatalf("parent's source changed to %q", got)
	}
}
