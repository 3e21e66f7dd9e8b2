package snapstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"golang.org/x/sys/unix"
)

// notBlocked runs f, failing the test if it has not returned within a
// minute: a FIFO that blocks its reader's open is unblocked then (a writer
// opens it), so that the test fails instead of hanging.
func notBlocked(t *testing.T, fifo string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute): // a bound on a hang, not a synchronisation
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatalf("a reader of the store blocked on the FIFO %s planted in its directory", fifo)
		return nil
	}
}

// TestLocalRefusesPlanted: a directory store reads only regular files. A
// symlink planted as a root (or as a root's directory) is not followed, a
// FIFO does not block the reader, and each is refused with an error that
// says what it is; a root that is not a regular file is taken as absent
// (so the next upload replaces it); a ref that is not a regular file names
// nothing, and is logged; a stored image whose manifest or file is
// replaced by a symlink or FIFO is refused, not read through.
func TestLocalRefusesPlanted(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := snapstore.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s.SetLog(slog.New(slog.NewTextHandler(&logs, nil)))
	outside := t.TempDir()
	secret := []byte("a file outside the store, not to be read through it")
	if err := os.WriteFile(filepath.Join(outside, "root"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	rootID := func(n string) (string, string) {
		sum := sha256.Sum256([]byte(n))
		return "sha256:" + hex.EncodeToString(sum[:]), filepath.Join(root, "roots", "sha256-"+hex.EncodeToString(sum[:]))
	}
	plant := func(dir string, make func(p string) error) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "root")
		if err := make(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refused := func(id, what, fifo string) {
		t.Helper()
		err := notBlocked(t, fifo, func() error {
			rc, err := s.OpenRoot(t.Context(), id)
			if err == nil {
				b, _ := io.ReadAll(rc)
				rc.Close()
				t.Errorf("OpenRoot of %s read %d bytes (%.40q)", what, len(b), b)
			}
			return err
		})
		if !errors.Is(err, snapstore.ErrNotRegular) || !errors.Is(err, snapstore.ErrBadRoot) || !strings.Contains(err.Error(), what) {
			t.Fatalf("OpenRoot of %s: %v (want a refusal that says %q)", what, err, what)
		}
		t.Logf("%s: %v", what, err)
		if has, err := s.HasRoot(t.Context(), id); has || err != nil {
			t.Fatalf("HasRoot of %s: %v %v, want absent", what, has, err)
		}
	}

	id, dir := rootID("a symlink")
	plant(dir, func(p string) error { return os.Symlink(filepath.Join(outside, "root"), p) })
	refused(id, "a symlink", "")

	id, dir = rootID("a FIFO")
	fifo := plant(dir, func(p string) error { return unix.Mkfifo(p, 0o600) })
	refused(id, "a FIFO", fifo)

	// A root's directory that is a symlink: its root is not read either.
	id, dir = rootID("a symlinked directory")
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	err = notBlocked(t, "", func() error {
		rc, err := s.OpenRoot(t.Context(), id)
		if err == nil {
			rc.Close()
		}
		return err
	})
	if !errors.Is(err, snapstore.ErrNotRegular) {
		t.Fatalf("OpenRoot under a symlinked directory: %v, want refused", err)
	}

	// An upload replaces what was planted.
	id, dir = rootID("a FIFO")
	good := []byte("a root stream")
	if err := s.PutRoot(t.Context(), id, func(w io.Writer) error { _, err := w.Write(good); return err }); err != nil {
		t.Fatal(err)
	}
	rc, err := s.OpenRoot(t.Context(), id)
	if err != nil {
		t.Fatalf("a root uploaded over a planted FIFO: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(b, good) {
		t.Fatalf("a root uploaded over a planted FIFO reads back %q, %v", b, err)
	}

	// A ref that is a symlink names nothing.
	id, dir = rootID("a planted ref")
	if err := os.MkdirAll(filepath.Join(dir, "refs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "root"), filepath.Join(dir, "refs", "sha256-"+strings.Repeat("0", 64))); err != nil {
		t.Fatal(err)
	}
	if named, err := s.RootNamed(t.Context(), id); named || err != nil {
		t.Fatalf("a symlink as a ref names the root: %v %v", named, err)
	}
	if !strings.Contains(logs.String(), "not a regular file") {
		t.Fatalf("the skipped ref is not logged: %s", logs.String())
	}

	// A stored image whose file or manifest is replaced.
	for _, what := range []string{"file", "manifest"} {
		info, err := s.Put(t.Context(), storetest.MakeImage(t, filepath.Join(t.TempDir(), "img"), 64<<10+len(what)))
		if err != nil {
			t.Fatal(err)
		}
		idir := filepath.Join(root, "sha256-"+strings.TrimPrefix(string(info.Digest), "sha256:"))
		victim := filepath.Join(idir, ".stateimg.json")
		if what == "file" {
			victim = filepath.Join(idir, "pages.img")
		}
		if err := os.Remove(victim); err != nil {
			t.Fatal(err)
		}
		fifo := ""
		if what == "manifest" {
			fifo = victim
			err = unix.Mkfifo(victim, 0o600)
		} else {
			err = os.Symlink(filepath.Join(outside, "root"), victim)
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "fetched")
		err = notBlocked(t, fifo, func() error { return s.Fetch(t.Context(), info.Digest, dst) })
		if !errors.Is(err, snapstore.ErrNotRegular) {
			t.Fatalf("Fetch of an image whose %s is planted: %v, want refused", what, err)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused fetch left %s: %v", dst, err)
		}
		left, _ := os.ReadDir(filepath.Dir(dst))
		if len(left) != 0 {
			t.Fatalf("a refused fetch left %v", left)
		}
	}
}

// TestLocalWritesNoSymlinkDir: a directory store's deletes, renames,
// links, writes and listings follow no symlink planted as one of its
// directories (a root's directory, its refs, image-roots, roots itself),
// as its opens do not: each is refused with an error that says so, and
// nothing outside the store is removed, moved or written; with openat2
// and without it (ENOSYS, EPERM: each name opened in turn). Before,
// DeleteRoot removed the file a symlinked root directory pointed at, a
// sweep's set-aside renamed it, and a ref or an image's root identity was
// written through it.
func TestLocalWritesNoSymlinkDir(t *testing.T) {
	for _, without := range []error{nil, unix.ENOSYS, unix.EPERM} {
		name := "openat2"
		if without != nil {
			name = "no-openat2-" + without.Error()
		}
		t.Run(name, func(t *testing.T) {
			if without != nil {
				snapstore.WithoutOpenat2(t, without)
			}
			localWritesNoSymlinkDir(t)
		})
	}
}

func localWritesNoSymlinkDir(t *testing.T) {
	const d = snapstore.Digest("sha256:" + "ab" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd")
	hexOf := func(s string) string { return s[len("sha256:"):] }
	rootID := func(n string) string {
		sum := sha256.Sum256([]byte(n))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	// outside is a directory shaped as a root's: a root, a ref and an
	// aside root of the sweep's tag.
	mkOutside := func(t *testing.T) (string, map[string]string) {
		outside := t.TempDir()
		files := map[string]string{
			"root":                            "someone else's root",
			"aside-a1":                        "someone else's aside",
			"refs/sha256-" + hexOf(string(d)): "",
			"sha256-" + hexOf(string(d)):      "someone else's image root",
		}
		for n, b := range files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(outside, n)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, n), []byte(b), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return outside, files
	}
	// intact fails the test if outside changed: a file gone, changed or
	// added.
	intact := func(t *testing.T, outside string, files map[string]string, what string) {
		t.Helper()
		seen := 0
		err := filepath.WalkDir(outside, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(outside, p)
			want, ok := files[rel]
			if !ok {
				return fmt.Errorf("%s was written outside the store", rel)
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != want {
				return fmt.Errorf("%s outside the store changed: %q %v", rel, b, err)
			}
			seen++
			return nil
		})
		if err == nil && seen != len(files) {
			err = fmt.Errorf("%d of the %d files outside the store are left", seen, len(files))
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	refused := func(t *testing.T, err error, what string) {
		t.Helper()
		if !errors.Is(err, snapstore.ErrNotRegular) || !strings.Contains(err.Error(), "symlink") {
			t.Fatalf("%s through a symlinked directory: %v, want refused (a symlink)", what, err)
		}
	}
	put := func(w io.Writer) error { _, err := w.Write([]byte("a root stream")); return err }

	// A root's directory planted as a symlink.
	for _, op := range []string{"DeleteRoot", "SetRootAside", "RestoreRoot", "DropRootAside", "PutRoot", "RefRoot", "UnrefRoot", "RootNamed"} {
		t.Run("rootdir/"+op, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "store")
			s, err := snapstore.NewLocal(root)
			if err != nil {
				t.Fatal(err)
			}
			outside, files := mkOutside(t)
			id := rootID(op)
			if err := os.MkdirAll(filepath.Join(root, "roots"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(root, "roots", "sha256-"+hexOf(id))); err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			switch op {
			case "DeleteRoot":
				refused(t, s.DeleteRoot(ctx, id), op)
			case "SetRootAside":
				_, err := s.SetRootAside(ctx, id, "b2")
				refused(t, err, op)
			case "RestoreRoot":
				if err := os.Remove(filepath.Join(outside, "root")); err != nil {
					t.Fatal(err)
				}
				delete(files, "root")
				refused(t, s.RestoreRoot(ctx, id, "a1"), op)
			case "DropRootAside":
				refused(t, s.DropRootAside(ctx, id, "a1"), op)
			case "PutRoot":
				refused(t, s.PutRoot(ctx, id, put), op)
			case "RefRoot":
				refused(t, s.RefRoot(ctx, id, snapstore.Digest("sha256:"+strings.Repeat("cd", 32))), op)
			case "UnrefRoot":
				// The image's root identity names the planted root.
				if err := os.MkdirAll(filepath.Join(root, "image-roots"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, "image-roots", "sha256-"+hexOf(string(d))), []byte(id), 0o600); err != nil {
					t.Fatal(err)
				}
				_, _, err := s.UnrefRoot(ctx, d)
				refused(t, err, op)
			case "RootNamed":
				named, err := s.RootNamed(ctx, id)
				if named {
					t.Fatalf("a ref under a symlinked root directory names the root")
				}
				refused(t, err, op)
			}
			intact(t, outside, files, op)
		})
	}

	// image-roots, and roots itself, planted as symlinks.
	for _, dir := range []string{"image-roots", "roots"} {
		t.Run(dir, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "store")
			s, err := snapstore.NewLocal(root)
			if err != nil {
				t.Fatal(err)
			}
			outside, files := mkOutside(t)
			if err := os.Symlink(outside, filepath.Join(root, dir)); err != nil {
				t.Fatal(err)
			}
			id := rootID(dir)
			err = s.RefRoot(t.Context(), id, snapstore.Digest("sha256:"+strings.Repeat("ef", 32)))
			refused(t, err, "RefRoot")
			if dir == "image-roots" {
				// UnrefRoot reads image-roots/sha256-D through the symlink
				// no more than it removes it.
				_, _, err := s.UnrefRoot(t.Context(), d)
				refused(t, err, "UnrefRoot")
			} else {
				refused(t, s.PutRoot(t.Context(), id, put), "PutRoot")
			}
			intact(t, outside, files, dir)
		})
	}

	// Plain: every step still works.
	root := filepath.Join(t.TempDir(), "store")
	s, err := snapstore.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	id := rootID("plain")
	if err := s.RefRoot(ctx, id, d); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRoot(ctx, id, put); err != nil {
		t.Fatal(err)
	}
	if named, err := s.RootNamed(ctx, id); !named || err != nil {
		t.Fatalf("RootNamed: %v %v", named, err)
	}
	if aside, err := s.SetRootAside(ctx, id, "c3"); !aside || err != nil {
		t.Fatalf("SetRootAside: %v %v", aside, err)
	}
	if err := s.RestoreRoot(ctx, id, "c3"); err != nil {
		t.Fatal(err)
	}
	if has, err := s.HasRoot(ctx, id); !has || err != nil {
		t.Fatalf("HasRoot after RestoreRoot: %v %v", has, err)
	}
	if got, unnamed, err := s.UnrefRoot(ctx, d); got != id || !unnamed || err != nil {
		t.Fatalf("UnrefRoot: %q %v %v", got, unnamed, err)
	}
	if err := s.DeleteRoot(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "roots", "sha256-"+hexOf(id))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a deleted root's directory: %v, want gone", err)
	}
}

// TestLocalRootNamedHugeRefs: a root's refs directory with many entries
// planted that are not refs (symlinks named as refs) is answered without
// a log line per entry: the skipped ones are logged once, with their
// count; a real ref after them still names the root.
func TestLocalRootNamedHugeRefs(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := snapstore.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s.SetLog(slog.New(slog.NewTextHandler(&logs, nil)))
	sum := sha256.Sum256([]byte("a root"))
	id := "sha256:" + hex.EncodeToString(sum[:])
	refs := filepath.Join(root, "roots", "sha256-"+hex.EncodeToString(sum[:]), "refs")
	if err := os.MkdirAll(refs, 0o700); err != nil {
		t.Fatal(err)
	}
	const planted = 5000
	for i := range planted {
		if err := os.Symlink("/etc/passwd", filepath.Join(refs, fmt.Sprintf("sha256-%064x", i))); err != nil {
			t.Fatal(err)
		}
	}
	named, err := s.RootNamed(t.Context(), id)
	if err != nil || named {
		t.Fatalf("RootNamed with %d planted symlinks: %v %v, want not named", planted, named, err)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), fmt.Sprint(planted)) {
		t.Fatalf("RootNamed with %d planted symlinks logged %d lines (want 1, with the count): %.300s", planted, n, logs.String())
	}
	if err := os.WriteFile(filepath.Join(refs, "sha256-"+strings.Repeat("f", 64)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if named, err := s.RootNamed(t.Context(), id); err != nil || !named {
		t.Fatalf("RootNamed with a ref among %d planted symlinks: %v %v, want named", planted, named, err)
	}
}
