package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Image roots in a directory store, as in S3 (roots.go), under its root:
//
//	roots/sha256-HEX/root           the root stream (written to a temporary
//	                                file, then renamed: whole or absent)
//	roots/sha256-HEX/refs/sha256-D  one empty file per stored image D on it
//	roots/sha256-HEX/aside-TAG      the root set aside by a sweep
//	image-roots/sha256-D            the identity of image D's root (beside
//	                                the image's directory, which is its
//	                                sealed files only)
//
// Never sealed: a directory store with --encrypt-at-rest is refused at
// start (cmd/clade), as it would hold sandbox memory in the clear.

func (l *Local) rootDir(id string) string {
	return filepath.Join(l.root, "roots", "sha256-"+Digest(id).hex())
}

func (l *Local) imageRoot(d Digest) string {
	return filepath.Join(l.root, "image-roots", "sha256-"+d.hex())
}

// HasRoot implements RootStore.
func (l *Local) HasRoot(ctx context.Context, id string) (bool, error) {
	if err := validRoot(id); err != nil {
		return false, err
	}
	// Not followed: only a regular file is a root (anything else there
	// is replaced by the next upload's rename), and only in a directory
	// of the store's (one planted as a symlink refuses the upload too).
	p := filepath.Join(l.rootDir(id), "root")
	var st unix.Stat_t
	err := l.at(p, func(dir int, name string) error { return unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		l.logger().Warn("snapshot store: an image root in the object store's directory is not a regular file: taken as absent", "path", p, "type", fileType(st.Mode))
		return false, nil
	}
	return err == nil, err
}

// PutRoot implements RootStore.
func (l *Local) PutRoot(ctx context.Context, id string, send func(w io.Writer) error) error {
	if err := validRoot(id); err != nil {
		return err
	}
	dir := l.rootDir(id)
	var f *os.File
	var err error
	for range 3 { // a tidyRoot of the empty directory may race the first
		f, err = l.createObject(dir, ".put-")
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = send(&ctxWriter{ctx: ctx, w: f})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = l.renameObject(tmp, filepath.Join(dir, "root")) // the commit
	}
	if err != nil {
		return errors.Join(fmt.Errorf("put root %s: %w", short(Digest(id)), err), l.removeObject(tmp))
	}
	return nil
}

// OpenRoot implements RootStore.
func (l *Local) OpenRoot(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := validRoot(id); err != nil {
		return nil, err
	}
	f, err := l.openObject(filepath.Join(l.rootDir(id), "root"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.New(errdefs.NotFound, "image root %s is not in the object store %s", short(Digest(id)), l.root)
	}
	if errors.Is(err, ErrNotRegular) {
		// Not clade's: deleted as a root that does not open would be.
		return nil, errdefs.Wrap(errdefs.Conflict, fmt.Errorf("image root %s: %w: %w", short(Digest(id)), ErrBadRoot, err))
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// RefRoot implements RootStore.
func (l *Local) RefRoot(ctx context.Context, id string, d Digest) error {
	if err := validRoot(id); err != nil {
		return err
	}
	refs := filepath.Join(l.rootDir(id), "refs")
	var err error
	for range 3 { // a tidyRoot of the empty directories may race the first
		if err = l.mkdirAll(refs); err == nil {
			err = l.at(filepath.Join(refs, "sha256-"+d.hex()), func(dir int, name string) error {
				fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
				if err == nil {
					err = unix.Close(fd)
				}
				return err
			})
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	return l.writeObject(l.imageRoot(d), []byte(id))
}

// UnrefRoot implements RootStore.
func (l *Local) UnrefRoot(ctx context.Context, d Digest) (string, bool, error) {
	b, err := l.readObject(l.imageRoot(d), 128)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	id := string(b)
	if validRoot(id) != nil {
		return "", false, fmt.Errorf("stored image %s names a bad image root %.80q", short(d), id)
	}
	if err := l.removeObject(filepath.Join(l.rootDir(id), "refs", "sha256-"+d.hex())); err != nil {
		return id, false, err
	}
	if err := l.removeObject(l.imageRoot(d)); err != nil {
		return id, false, err
	}
	named, err := l.RootNamed(ctx, id)
	return id, err == nil && !named, err
}

// RootNamed implements RootStore.
func (l *Local) RootNamed(ctx context.Context, id string) (bool, error) {
	if err := validRoot(id); err != nil {
		return false, err
	}
	refs := filepath.Join(l.rootDir(id), "refs")
	named, skipped, first := false, 0, ""
	err := l.listDir(refs, func(e fs.DirEntry) bool {
		if !strings.HasPrefix(e.Name(), "sha256-") {
			return false
		}
		if !e.Type().IsRegular() {
			// Not a ref RefRoot wrote: it keeps nothing.
			if skipped++; first == "" {
				first = e.Name() + " (" + e.Type().String() + ")"
			}
			return false
		}
		named = true
		return true
	})
	if skipped > 0 {
		// Once a listing: whoever planted them chooses how many.
		l.logger().Warn("snapshot store: skipped entries of the object store's directory that are not regular files", "dir", refs, "count", skipped, "first", first)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return named, err
}

func (l *Local) aside(id, tag string) string { return filepath.Join(l.rootDir(id), "aside-"+tag) }

// SetRootAside implements RootStore.
func (l *Local) SetRootAside(ctx context.Context, id, tag string) (bool, error) {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return false, err
	}
	err := l.renameObject(filepath.Join(l.rootDir(id), "root"), l.aside(id, tag))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// RestoreRoot implements RootStore. A link, not a rename: a root stored
// meanwhile stays (the link fails), and then the aside one goes.
func (l *Local) RestoreRoot(ctx context.Context, id, tag string) error {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return err
	}
	err := l.linkObject(l.aside(id, tag), filepath.Join(l.rootDir(id), "root"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // none set aside
	case err != nil && !errors.Is(err, fs.ErrExist):
		return err
	}
	return l.removeObject(l.aside(id, tag))
}

// DropRootAside implements RootStore.
func (l *Local) DropRootAside(ctx context.Context, id, tag string) error {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return err
	}
	if err := l.removeObject(l.aside(id, tag)); err != nil {
		return err
	}
	l.tidyRoot(id)
	return nil
}

// DeleteRoot implements RootStore.
func (l *Local) DeleteRoot(ctx context.Context, id string) error {
	if err := validRoot(id); err != nil {
		return err
	}
	if err := l.removeObject(filepath.Join(l.rootDir(id), "root")); err != nil {
		return err
	}
	l.tidyRoot(id)
	return nil
}

// tidyRoot removes root id's directories once they hold nothing (a
// concurrent RefRoot or PutRoot that made them anew fails its write and
// reports it, as on any store error).
func (l *Local) tidyRoot(id string) {
	_ = l.removeEmptyDir(filepath.Join(l.rootDir(id), "refs"))
	_ = l.removeEmptyDir(l.rootDir(id))
}

type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// writeObject writes b to p under the root: a new file, renamed into
// place.
func (l *Local) writeObject(p string, b []byte) error {
	f, err := l.createObject(filepath.Dir(p), ".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = l.renameObject(f.Name(), p)
	}
	if err != nil {
		return errors.Join(err, l.removeObject(f.Name()))
	}
	return nil
}

// writeFileAtomic writes b to p (a file of the node's own, outside any
// store): a new file, renamed into place.
func writeFileAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		if rerr := os.Remove(f.Name()); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		return err
	}
	return nil
}
