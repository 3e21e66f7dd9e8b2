package stateimg

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// image makes a sealed image with a few files.
func image(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"checkpoint.img": strings.Repeat("state", 1000),
		"pages.img":      strings.Repeat("\x00\x01pages", 5000),
		"pages_meta.img": "meta",
		"empty.img":      "",
		"sub/x.img":      "nested",
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Seal(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string // in the error; empty: intact
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"truncated", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "pages.img"), 123); err != nil {
				t.Fatal(err)
			}
		}, "pages.img has 123 bytes, expected 35000"},
		{"flipped byte", func(t *testing.T, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, "checkpoint.img"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{'S' ^ 0x20 ^ 0x01}, 2500); err != nil {
				t.Fatal(err)
			}
		}, "checkpoint.img does not match its checksum"},
		{"flipped nested byte", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "sub/x.img"), []byte("Nested"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "sub/x.img does not match its checksum"},
		{"missing manifest", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, ManifestName)); err != nil {
				t.Fatal(err)
			}
		}, "no manifest"},
		{"garbled manifest", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "manifest .stateimg.json is unreadable"},
		{"missing file", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "empty.img")); err != nil {
				t.Fatal(err)
			}
		}, "empty.img is missing"},
		{"extra file", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "stray"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "stray is not part of the image"},
		{"symlink", func(t *testing.T, dir string) {
			if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
		}, "link is not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := image(t)
			if err := Verify(dir); err != nil {
				t.Fatalf("verify of a fresh image: %v", err)
			}
			tc.damage(t, dir)
			err := Verify(dir)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "state image is corrupt: ") {
				t.Fatalf("verify = %v; want %q", err, "state image is corrupt: ..."+tc.want)
			}
			if !errors.Is(err, ErrCorrupt) || !errdefs.IsConflict(err) {
				t.Fatalf("verify = %v: want ErrCorrupt and class conflict, got class %s", err, errdefs.ClassOf(err))
			}
		})
	}
}

func TestSealAgain(t *testing.T) {
	dir := image(t)
	if err := os.WriteFile(filepath.Join(dir, "late.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Seal(dir); err != nil {
		t.Fatal(err)
	}
	if err := Verify(dir); err != nil {
		t.Fatalf("verify after sealing again: %v", err)
	}
	if !Sealed(dir) || Sealed(t.TempDir()) {
		t.Fatal("Sealed wrong")
	}
}

func TestVerifyAs(t *testing.T) {
	dir := image(t)
	if err := os.Truncate(filepath.Join(dir, "pages.img"), 123); err != nil {
		t.Fatal(err)
	}
	want := "snapshot abc is corrupt: pages.img has 123 bytes, expected 35000"
	if err := VerifyAs(dir, "snapshot abc"); err == nil || err.Error() != want || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("VerifyAs = %v, want %q", err, want)
	}
}

func TestVerifyMissingDir(t *testing.T) {
	if err := Verify(filepath.Join(t.TempDir(), "nope")); !errdefs.IsNotFound(err) {
		t.Fatalf("verify of a missing dir: %v, want not-found", err)
	}
}

func BenchmarkVerify(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 64<<20), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := Seal(dir); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(64 << 20)
	for b.Loop() {
		forget(dir)
		if err := Verify(dir); err != nil {
			b.Fatal(err)
		}
	}
}
