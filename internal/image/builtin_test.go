package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDebootstrap puts a debootstrap on PATH that makes a root with the
// --include list in a file, or fails when the list names "broken".
func fakeDebootstrap(t *testing.T) {
	bin := t.TempDir()
	script := `#!/bin/sh
for a; do case "$a" in --include=*) inc="${a#--include=}";; esac; done
case "$inc" in *broken*) echo "E: no package broken" >&2; exit 1;; esac
mkdir -p "$4/etc" && echo "$inc" > "$4/etc/included"
`
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
}

func TestEnsureBuiltin(t *testing.T) {
	fakeDebootstrap(t)
	posts := 0
	RegisterRecipe(Recipe{Name: "test-recipe", About: "a test", Include: []string{"git", "curl"},
		Post: func(_ context.Context, rootfs string) error {
			posts++
			return os.WriteFile(filepath.Join(rootfs, "etc", "finished"), nil, 0o644)
		}})
	RegisterRecipe(Recipe{Name: "test-broken", Include: []string{"broken"}})
	defer delete(recipes, "test-recipe")
	defer delete(recipes, "test-broken")
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.EnsureBuiltin(ctx, "test-recipe"); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureBuiltin(ctx, "test-recipe"); err != nil || posts != 1 {
		t.Fatalf("second ensure: err %v, post ran %d times (want once)", err, posts)
	}
	img, err := s.Descriptor(ctx, "test-recipe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(img.Source, "--include=git,curl") {
		t.Errorf("source %q does not name the packages", img.Source)
	}
	b, err := os.ReadFile(filepath.Join(img.RootFS, "etc", "included"))
	if err != nil || strings.TrimSpace(string(b)) != "git,curl" {
		t.Errorf("root's include list %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(img.RootFS, "etc", "finished")); err != nil {
		t.Errorf("post step did not run on the root: %v", err)
	}
	// A failed build shows no image, and a new store's cleanup leaves the
	// built-in build directory to its own lock.
	kept := s.FailedBuildLog("test-broken")
	for attempt := 1; attempt <= 2; attempt++ {
		// The log outlives the build directory, which the next attempt
		// removes, and the error names where it is.
		err := s.EnsureBuiltin(ctx, "test-broken")
		if err == nil || !strings.Contains(err.Error(), kept) {
			t.Fatalf("broken build, attempt %d: %v, want an error naming %s", attempt, err, kept)
		}
		b, rerr := os.ReadFile(kept)
		if rerr != nil || !strings.Contains(string(b), "E: no package broken") || !strings.Contains(string(b), "debootstrap of the test-broken image failed") {
			t.Fatalf("kept log, attempt %d: %q, %v", attempt, b, rerr)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(kept), buildPrefix+"test-broken", "debootstrap.log")); err != nil {
		t.Fatalf("the failed build's own log: %v", err)
	}
	if s.Built("test-broken") {
		t.Fatal("a failed build shows as an image")
	}
	if err := s.EnsureBuiltin(ctx, "no-such"); err == nil || !strings.Contains(err.Error(), "built-in images are") {
		t.Fatalf("unknown recipe: %v", err)
	}
}

// TestStoreLeavesUnknownBuiltinBuilds: a store opened by a binary that does
// not register a built-in image (a test binary without its package) leaves
// that image's build alone while it goes on, and still removes what a
// killed layered build left.
func TestStoreLeavesUnknownBuiltinBuilds(t *testing.T) {
	dir := t.TempDir()
	building := filepath.Join(dir, buildPrefix+"not-registered-here")
	left := filepath.Join(dir, buildPrefix+"some-image-0123abcd")
	for _, d := range []string{filepath.Join(building, "rootfs"), left} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ".not-registered-here.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(dir, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(building, "rootfs")); err != nil {
		t.Fatalf("a built-in image's build in progress was removed: %v", err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("a killed layered build's directory is still there: %v", err)
	}
}
