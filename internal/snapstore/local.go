package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"golang.org/x/sys/unix"
)

// Local is a Store in a directory of this host: ROOT/sha256-HEX is a
// sealed image. On the filesystem of the images it stores it costs no
// disk: files are hard-linked in and out (or cloned, reflink, where a link
// cannot be made), and copied only across filesystems. Images are never written after their seal, so
// a link is as good as a copy; a file changed in place through a link
// anyway fails the verification of the next Fetch instead of being used.
type Local struct {
	root string
	log  *slog.Logger // SetLog; nil: discarded
}

var _ Store = (*Local)(nil)

// NewLocal returns a Local store in root, making it if needed.
func NewLocal(root string) (*Local, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	return &Local{root: root}, nil
}

func (l *Local) dir(d Digest) string { return filepath.Join(l.root, "sha256-"+d.hex()) }

// Put implements Store.
func (l *Local) Put(ctx context.Context, dir string) (Info, error) {
	_, d, files, err := sealedForPut(dir)
	if err != nil {
		return Info{}, err
	}
	if in, err := l.Stat(ctx, d); err == nil {
		return in, nil
	}
	dst := l.dir(d)
	tmp, err := os.MkdirTemp(l.root, ".put-")
	if err != nil {
		return Info{}, err
	}
	names := []string{stateimg.ManifestName}
	for _, f := range files {
		names = append(names, f.Name)
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return Info{}, errors.Join(err, os.RemoveAll(tmp))
		}
		if err := linkOrCopy(filepath.Join(dir, filepath.FromSlash(n)), filepath.Join(tmp, filepath.FromSlash(n))); err != nil {
			return Info{}, errors.Join(fmt.Errorf("put %s: %w", dir, err), os.RemoveAll(tmp))
		}
	}
	// The rename is the commit: a dir under its digest is whole.
	if err := os.Rename(tmp, dst); err != nil {
		rmErr := os.RemoveAll(tmp)
		if _, serr := l.Stat(ctx, d); serr == nil {
			return infoOf(d, files), nil // a concurrent Put of the same image won
		}
		return Info{}, errors.Join(fmt.Errorf("put %s: %w", dir, err), rmErr)
	}
	return infoOf(d, files), nil
}

// Fetch implements Store.
func (l *Local) Fetch(ctx context.Context, d Digest, dir string) error {
	if _, err := Parse(string(d)); err != nil {
		return err
	}
	if ok, err := existingCopy(d, dir); ok || err != nil {
		return err
	}
	src := l.dir(d)
	b, files, err := l.readManifest(src)
	if errors.Is(err, fs.ErrNotExist) && !exists(src) {
		return errdefs.New(errdefs.NotFound, "stored image %s not found", short(d))
	}
	if errors.Is(err, ErrNotRegular) {
		return fmt.Errorf("stored image %s: %w", short(d), err)
	}
	if err != nil {
		return corrupt(d, "%v", err)
	}
	if digestBytes(b) != d {
		return corrupt(d, "its manifest does not match its digest")
	}
	tmp, err := tempDir(dir)
	if err != nil {
		return err
	}
	for _, n := range append([]string{stateimg.ManifestName}, names(files)...) {
		if err := ctx.Err(); err != nil {
			return errors.Join(err, os.RemoveAll(tmp))
		}
		err := l.fetchObject(filepath.Join(src, filepath.FromSlash(n)), filepath.Join(tmp, filepath.FromSlash(n)))
		if errors.Is(err, fs.ErrNotExist) {
			return errors.Join(corrupt(d, "%s is missing", n), os.RemoveAll(tmp))
		}
		if err != nil {
			return errors.Join(fmt.Errorf("fetch %s: %w", short(d), err), os.RemoveAll(tmp))
		}
	}
	return finish(d, tmp, dir)
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, d Digest) (Info, error) {
	if _, err := Parse(string(d)); err != nil {
		return Info{}, err
	}
	b, files, err := l.readManifest(l.dir(d))
	if err != nil || digestBytes(b) != d {
		return Info{}, errdefs.New(errdefs.NotFound, "stored image %s not found", short(d))
	}
	return infoOf(d, files), nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, d Digest) error {
	if _, err := Parse(string(d)); err != nil {
		return err
	}
	// Renamed away first, so a Delete killed midway leaves no partial
	// image under the digest.
	dir := l.dir(d)
	gone := filepath.Join(l.root, ".delete-"+d.hex())
	if err := os.Rename(dir, gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(gone)
}

// readManifest reads the manifest of the stored image in dir (a regular
// file only: openObject) and its files.
func (l *Local) readManifest(dir string) ([]byte, []stateimg.File, error) {
	b, err := l.readObject(filepath.Join(dir, stateimg.ManifestName), 64<<20)
	if err != nil {
		return nil, nil, err
	}
	files, err := stateimg.ParseManifest(b)
	return b, files, err
}

func names(files []stateimg.File) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Name
	}
	return out
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// linkOrCopy makes dst a hard link to src, else a reflink clone, else a
// copy, making dst's parent directories.
func linkOrCopy(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	} else if errors.Is(err, fs.ErrNotExist) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	_, err = io.Copy(out, in) // copy_file_range where the kernel can
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
