package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine/gvisor/bundle"
)

// TestNeedsView: a sandbox keeps the image root itself only when every
// bind mount's destination is there already, through real directories.
func TestNeedsView(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"mnt", "etc", "run"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "resolv.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/run", filepath.Join(root, "varrun")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst   string
		tmpfs bool
		want  bool
	}{
		{"/mnt", false, false},
		{"/etc/resolv.conf", false, false},
		{"/data", false, true},
		{"/mnt/deep/er", false, true},
		{"/varrun", false, true},
		{"/varrun/x", false, true},
		{"/mnt/../etc", false, true},
		{"/new/tmpfs", true, false},
	} {
		if got := needsView(root, []bundle.Mount{{Source: "/s", Destination: "/mnt"}, {Source: "/s", Destination: tc.dst, Tmpfs: tc.tmpfs}}); got != tc.want {
			t.Errorf("needsView(%s, tmpfs %v) = %v, want %v", tc.dst, tc.tmpfs, got, tc.want)
		}
	}
	if needsView(root, nil) {
		t.Error("no mounts need a view")
	}
}

// TestNewDetachesLeftViews: a view a killed daemon left mounted on the
// host is detached by the next engine, and Destroy detaches one before it
// removes the sandbox's directory, never walking into the image through it.
func TestNewDetachesLeftViews(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounts need root")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake-binary")
	if err := os.WriteFile(fake, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "image")
	if err := os.MkdirAll(filepath.Join(image, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "usr", "f"), []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{StateDir: filepath.Join(dir, "state"), Runsc: fake, AgentPath: fake}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"view000000000001", "view000000000002"}
	for _, id := range ids {
		if err := os.Mkdir(e.dir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		v, err := e.mountView(id, image)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(v, "usr", "f")); err != nil || string(b) != "image" {
			t.Fatalf("the view does not show the image: %q %v", b, err)
		}
	}
	t.Cleanup(func() {
		for _, id := range ids {
			_ = detachAll(e.viewPath(id))
		}
	})
	mounted := func(id string) bool {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Contains(string(b), " "+e.viewPath(id)+" ")
	}
	if !mounted(ids[0]) || !mounted(ids[1]) {
		t.Fatal("the views are not mounted: nothing to test")
	}
	if err := e.Destroy(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	if mounted(ids[0]) {
		t.Fatal("Destroy left the view mounted")
	}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if mounted(ids[1]) {
		t.Fatal("a new engine left a previous one's view mounted")
	}
	if b, err := os.ReadFile(filepath.Join(image, "usr", "f")); err != nil || string(b) != "image" {
		t.Fatalf("the image lost its file: %q %v", b, err)
	}
}

// BenchmarkView: what a root view adds to a start and a destroy: mount
// the overlay, detach it, remove its directories.
func BenchmarkView(b *testing.B) {
	if os.Getuid() != 0 {
		b.Skip("mounts need root")
	}
	dir := b.TempDir()
	fake := filepath.Join(dir, "fake-binary")
	if err := os.WriteFile(fake, []byte("x"), 0o755); err != nil {
		b.Fatal(err)
	}
	image := filepath.Join(dir, "image")
	if err := os.MkdirAll(filepath.Join(image, "usr"), 0o755); err != nil {
		b.Fatal(err)
	}
	e, err := New(Config{StateDir: filepath.Join(dir, "state"), Runsc: fake, AgentPath: fake})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		id := "bench00000000001"
		if err := os.Mkdir(e.dir(id), 0o700); err != nil {
			b.Fatal(err)
		}
		if _, err := e.mountView(id, image); err != nil {
			b.Fatal(err)
		}
		if err := e.dropView(id); err != nil {
			b.Fatal(err)
		}
		if err := os.RemoveAll(e.dir(id)); err != nil {
			b.Fatal(err)
		}
	}
}
