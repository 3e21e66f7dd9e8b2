package image

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/tarx"
)

// TestReplaceKeepsRootInUse: replacing an image gives it a new root; the old
// root stays while something stands on it and goes with GCRoots after.
func TestReplaceKeepsRootInUse(t *testing.T) {
	s := newTestStore(t)
	install := func(content string) Image {
		t.Helper()
		src := filepath.Join(t.TempDir(), "root")
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "version"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := tarx.Create(&buf, src, "."); err != nil {
			t.Fatal(err)
		}
		img, err := s.InstallTar(t.Context(), Image{Name: "app", Source: "test"}, &buf)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	v1 := install("one")
	v2 := install("two")
	if v1.RootFS == v2.RootFS {
		t.Fatalf("both versions share the root %s", v1.RootFS)
	}
	if b, _ := os.ReadFile(filepath.Join(v2.RootFS, "version")); string(b) != "two" {
		t.Fatalf("new root holds %q", b)
	}
	if err := s.GCRoots(map[string]bool{v1.RootFS: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(v1.RootFS, "version")); string(b) != "one" {
		t.Fatalf("the old root in use was touched: %q", b)
	}
	if err := s.GCRoots(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v1.RootFS); !os.IsNotExist(err) {
		t.Fatalf("the old root outlived its last user: %v", err)
	}
	if got, err := s.Get(t.Context(), "app"); err != nil || got.RootFS != v2.RootFS {
		t.Fatalf("image after collection: %+v %v", got, err)
	}
	assertClean(t, s, "app")
}
