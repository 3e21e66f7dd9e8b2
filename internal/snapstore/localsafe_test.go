package snapstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
