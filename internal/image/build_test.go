package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clade-sandbox/clade/internal/tarx"
)

// TestInstallTarMakesNewRoots: every install gets a root of its own (a
// replaced image's root lives on while sandboxes use it), announced to
// OnRoot before it exists; RemoveRoot removes only roots.
func TestInstallTarMakesNewRoots(t *testing.T) {
	s := newTestStore(t)
	var announced []string
	s.OnRoot = func(rootfs string) error {
		if _, err := os.Stat(rootfs); !os.IsNotExist(err) {
			t.Errorf("root %s exists before it was announced: %v", rootfs, err)
		}
		announced = append(announced, rootfs)
		return nil
	}
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
	if !slices.Equal(announced, []string{v1.RootFS, v2.RootFS}) {
		t.Fatalf("announced %v", announced)
	}
	for rootfs, want := range map[string]string{v1.RootFS: "one", v2.RootFS: "two"} {
		if b, _ := os.ReadFile(filepath.Join(rootfs, "version")); string(b) != want {
			t.Fatalf("root %s holds %q, want %q", rootfs, b, want)
		}
	}
	if err := s.RemoveRoot(v1.RootFS); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v1.RootFS); !os.IsNotExist(err) {
		t.Fatalf("removed root still there: %v", err)
	}
	for _, p := range []string{t.TempDir(), s.dir, filepath.Join(s.dir, "app")} {
		if err := s.RemoveRoot(p); err == nil {
			t.Errorf("RemoveRoot(%s) removed a directory that is not a root", p)
		}
	}
	// An OnRoot error abandons the install and leaves nothing.
	s.OnRoot = func(string) error { return errors.New("store down") }
	var buf bytes.Buffer
	if err := tarx.Create(&buf, t.TempDir(), "."); err != nil {
		t.Fatal(err)
	}
	if _, err := s.InstallTar(t.Context(), Image{Name: "app"}, &buf); err == nil {
		t.Fatal("install went on after OnRoot failed")
	}
	s.imgs["app"] = v2
	assertClean(t, s, "app")
}
