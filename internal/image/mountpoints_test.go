package image

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAddMountPoints: a root gets the engine's mount points before it is
// published; a root whose /.clade is a symlink (an image could ship one
// pointing anywhere on the host) gets nothing made through it.
func TestAddMountPoints(t *testing.T) {
	root := t.TempDir()
	if err := addMountPoints(root); err != nil {
		t.Fatal(err)
	}
	for _, p := range mountPoints {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v", p, err)
		}
	}
	if err := addMountPoints(root); err != nil {
		t.Fatalf("again: %v", err)
	}

	hostile, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(hostile, ".clade")); err != nil {
		t.Fatal(err)
	}
	if err := addMountPoints(hostile); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made %v through the image's symlink", ents)
	}
}
