// Package storetest is the conformance suite every snapstore.Store passes.
package storetest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

// Damage is how a test damages a stored image.
type Damage int

const (
	// Flip changes one byte of a stored file.
	Flip Damage = iota
	// Truncate cuts a stored file short.
	Truncate
	// Drop removes a stored file (the manifest stays).
	Drop
)

// Harness is a fresh, empty store and a way to damage what it holds.
type Harness struct {
	Store snapstore.Store
	// Damage damages the stored file of image d that holds the image's
	// file name.
	Damage func(t *testing.T, d snapstore.Digest, name string, how Damage)
}

// Run runs the suite; newHarness makes a fresh empty store per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("PutFetchRoundTrip", func(t *testing.T) {
		h := newHarness(t)
		src := MakeImage(t, t.TempDir(), 3<<20)
		in, err := h.Store.Put(t.Context(), src)
		if err != nil {
			t.Fatal(err)
		}
		d, files, err := snapstore.DigestOf(src)
		if err != nil {
			t.Fatal(err)
		}
		if in.Digest != d || in.Files != len(files) {
			t.Fatalf("Put = %+v, want digest %s and %d files", in, d, len(files))
		}
		st, err := h.Store.Stat(t.Context(), d)
		if err != nil || st != in {
			t.Fatalf("Stat = %+v, %v; want %+v", st, err, in)
		}
		if ok, err := snapstore.Has(t.Context(), h.Store, d); !ok || err != nil {
			t.Fatalf("Has = %v, %v", ok, err)
		}
		dst := filepath.Join(t.TempDir(), "img")
		if err := h.Store.Fetch(t.Context(), d, dst); err != nil {
			t.Fatal(err)
		}
		sameTree(t, src, dst)
		if err := stateimg.Verify(dst); err != nil {
			t.Fatal(err)
		}
		// A fetch into a dir holding that image already is a no-op.
		if err := h.Store.Fetch(t.Context(), d, dst); err != nil {
			t.Fatalf("Fetch into a warm copy: %v", err)
		}
		// The local source can go: the store keeps its own copy.
		if err := os.RemoveAll(src); err != nil {
			t.Fatal(err)
		}
		again := filepath.Join(t.TempDir(), "img")
		if err := h.Store.Fetch(t.Context(), d, again); err != nil {
			t.Fatal(err)
		}
		sameTree(t, dst, again)
	})
	t.Run("PutIsIdempotent", func(t *testing.T) {
		h := newHarness(t)
		src := MakeImage(t, t.TempDir(), 1<<20)
		a, err := h.Store.Put(t.Context(), src)
		if err != nil {
			t.Fatal(err)
		}
		b, err := h.Store.Put(t.Context(), src)
		if err != nil || a != b {
			t.Fatalf("second Put = %+v, %v; want %+v", b, err, a)
		}
	})
	t.Run("PutRefusesUnsealedAndCorrupt", func(t *testing.T) {
		h := newHarness(t)
		unsealed := t.TempDir()
		if err := os.WriteFile(filepath.Join(unsealed, "pages.img"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Store.Put(t.Context(), unsealed); !errors.Is(err, stateimg.ErrCorrupt) {
			t.Fatalf("Put of an unsealed dir = %v, want ErrCorrupt", err)
		}
		bad := MakeImage(t, t.TempDir(), 1<<20)
		flipFile(t, filepath.Join(bad, "pages.img"))
		if _, err := h.Store.Put(t.Context(), bad); !errors.Is(err, stateimg.ErrCorrupt) {
			t.Fatalf("Put of a corrupt image = %v, want ErrCorrupt", err)
		}
		d, _, _ := snapstore.DigestOf(bad)
		if _, err := h.Store.Stat(t.Context(), d); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("Stat after a refused Put = %v, want NotFound", err)
		}
	})
	t.Run("MissingAndBadDigest", func(t *testing.T) {
		h := newHarness(t)
		d := snapstore.Digest("sha256:" + string(bytes.Repeat([]byte("ab"), 32)))
		parent := t.TempDir()
		dst := filepath.Join(parent, "img")
		if err := h.Store.Fetch(t.Context(), d, dst); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("Fetch of a missing image = %v, want NotFound", err)
		}
		noLeftovers(t, parent)
		if _, err := h.Store.Stat(t.Context(), d); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("Stat of a missing image = %v, want NotFound", err)
		}
		if err := h.Store.Delete(t.Context(), d); err != nil {
			t.Fatalf("Delete of a missing image = %v, want nil", err)
		}
		for _, bad := range []string{"", "sha256:", "sha256:../../etc", "md5:00", "sha256:" + string(bytes.Repeat([]byte("A"), 64))} {
			if err := h.Store.Fetch(t.Context(), snapstore.Digest(bad), dst); !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Errorf("Fetch(%q) = %v, want InvalidArgument", bad, err)
			}
		}
		noLeftovers(t, parent)
	})
	t.Run("FetchIntoOtherDirRefused", func(t *testing.T) {
		h := newHarness(t)
		src := MakeImage(t, t.TempDir(), 1<<20)
		in, err := h.Store.Put(t.Context(), src)
		if err != nil {
			t.Fatal(err)
		}
		other := t.TempDir()
		if err := h.Store.Fetch(t.Context(), in.Digest, other); !errdefs.Is(err, errdefs.AlreadyExists) {
			t.Fatalf("Fetch into a dir holding something else = %v, want AlreadyExists", err)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		h := newHarness(t)
		src := MakeImage(t, t.TempDir(), 1<<20)
		in, err := h.Store.Put(t.Context(), src)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Store.Delete(t.Context(), in.Digest); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Store.Stat(t.Context(), in.Digest); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("Stat after Delete = %v, want NotFound", err)
		}
		if err := h.Store.Fetch(t.Context(), in.Digest, filepath.Join(t.TempDir(), "img")); !errdefs.Is(err, errdefs.NotFound) {
			t.Fatalf("Fetch after Delete = %v, want NotFound", err)
		}
		if err := h.Store.Delete(t.Context(), in.Digest); err != nil {
			t.Fatalf("second Delete = %v", err)
		}
		if err := stateimg.Verify(src); err != nil {
			t.Fatalf("Delete touched the source image: %v", err)
		}
		if _, err := h.Store.Put(t.Context(), src); err != nil {
			t.Fatalf("Put after Delete: %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		how  Damage
	}{{"Flip", Flip}, {"Truncate", Truncate}, {"Drop", Drop}} {
		t.Run("DamagedIsRefused/"+tc.name, func(t *testing.T) {
			h := newHarness(t)
			src := MakeImage(t, t.TempDir(), 2<<20)
			in, err := h.Store.Put(t.Context(), src)
			if err != nil {
				t.Fatal(err)
			}
			h.Damage(t, in.Digest, "pages.img", tc.how)
			parent := t.TempDir()
			dst := filepath.Join(parent, "img")
			err = h.Store.Fetch(t.Context(), in.Digest, dst)
			if !errors.Is(err, stateimg.ErrCorrupt) || !errdefs.Is(err, errdefs.Conflict) {
				t.Fatalf("Fetch of a damaged image = %v, want ErrCorrupt (Conflict)", err)
			}
			if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
				t.Fatalf("a refused Fetch left %s: %v", dst, serr)
			}
			noLeftovers(t, parent)
			t.Logf("refused: %v", err)
		})
	}
}

// MakeImage writes and seals an image in dir: a random pages file of size
// bytes with a hole in its middle, a nested file and an empty one.
func MakeImage(t testing.TB, dir string, size int) string {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	clear(data[size/4 : size/2]) // zeros, which a fetch may leave as a hole
	write := func(name string, b []byte) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("pages.img", data)
	write("meta/checkpoint.json", []byte(`{"pid":1}`))
	write("empty", nil)
	if err := stateimg.Seal(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func flipFile(t testing.TB, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 7); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, 7); err != nil {
		t.Fatal(err)
	}
}

func sameTree(t *testing.T, a, b string) {
	t.Helper()
	err := filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		x, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		y, err := os.ReadFile(filepath.Join(b, rel))
		if err != nil {
			return err
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// noLeftovers checks that a failed fetch left no temporary dir in parent.
func noLeftovers(t *testing.T, parent string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in %s: %s", parent, e.Name())
	}
}
