package snapstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"golang.org/x/sys/unix"
)

func TestLocal(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		root := t.TempDir()
		l, err := snapstore.NewLocal(root)
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Harness{Store: l, Damage: func(t *testing.T, d snapstore.Digest, name string, how storetest.Damage) {
			p := filepath.Join(root, "sha256-"+strings.TrimPrefix(string(d), "sha256:"), name)
			damageFile(t, p, how)
		}}
	})
}

// On one filesystem the local store costs no disk: its files are the
// image's own (links).
func TestLocalSharesBlocks(t *testing.T) {
	base := t.TempDir()
	src := storetest.MakeImage(t, filepath.Join(base, "src"), 1<<20)
	l, err := snapstore.NewLocal(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := l.Put(t.Context(), src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	if err := l.Fetch(t.Context(), in.Digest, dst); err != nil {
		t.Fatal(err)
	}
	var a, b unix.Stat_t
	if err := unix.Stat(filepath.Join(src, "pages.img"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dst, "pages.img"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 3 {
		t.Fatalf("fetched file is inode %d (nlink %d), source %d: want the same inode, 3 links", b.Ino, a.Nlink, a.Ino)
	}
}

func damageFile(t *testing.T, p string, how storetest.Damage) {
	t.Helper()
	switch how {
	case storetest.Flip:
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x55
		// Rewritten as a new file: the source's links keep the old bytes.
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	case storetest.Truncate:
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	case storetest.Drop:
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
}
