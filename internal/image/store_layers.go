package image

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Layout of the store besides the image directories:
//
//	blobs/sha256/<hex>     layer blobs as pulled, shared between images
//	.build-<name>-<rand>/  an image being built, flocked by its builder
//	.rm-<name>-<rand>/     an image being removed
//	.gc.lock               shared by builds, exclusive for garbage collection
const (
	blobsDir = "blobs"
	// rootsDir holds every installed root filesystem under its own id. An
	// image names its current root; replacing the image points it at a new
	// one, and the old root lives on while sandboxes or snapshots use it.
	rootsDir    = ".roots"
	buildPrefix = ".build-"
	rmPrefix    = ".rm-"
	gcLock      = ".gc.lock"
)

// cleanup removes what killed builds and removals left behind, and blobs no
// image uses. A build another live process holds is left alone.
func (s *Store) cleanup() {
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		p := filepath.Join(s.dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), rmPrefix):
			_ = os.RemoveAll(p)
		case strings.HasPrefix(e.Name(), buildPrefix) && e.Name() != buildPrefix+Default:
			// EnsureDefault's build has its own lock and cleanup.
			if f, err := os.Open(p); err == nil {
				if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
					_ = os.RemoveAll(p)
				}
				f.Close()
			}
		}
	}
	if err := s.gc(); err != nil {
		s.log.Warn("image blob garbage collection", "err", err)
	}
}

// build is a directory an image is assembled in before it is renamed into
// place, so a failed or interrupted build never shows as an image.
type build struct {
	dir  string
	lock *os.File // flock on dir: cleanup by other processes skips it
	gc   *os.File // shared lock on .gc.lock: blobs we use are not collected
}

// begin starts a build labelled label.
func (s *Store) begin(label string) (*build, error) {
	gc, err := s.lockGC(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	b := &build{dir: filepath.Join(s.dir, buildPrefix+label+"-"+randHex()), gc: gc}
	if err := os.Mkdir(b.dir, 0o700); err != nil {
		gc.Close()
		return nil, err
	}
	if b.lock, err = os.Open(b.dir); err == nil {
		err = unix.Flock(int(b.lock.Fd()), unix.LOCK_EX)
	}
	if err == nil {
		// Another process's cleanup may have taken the lock between
		// Mkdir and Flock and removed the directory.
		var fi, locked fs.FileInfo
		if fi, err = os.Stat(b.dir); err == nil {
			if locked, err = b.lock.Stat(); err == nil && !os.SameFile(fi, locked) {
				err = fmt.Errorf("build directory %s replaced", b.dir)
			}
		}
	}
	if err != nil {
		return nil, errors.Join(err, b.close())
	}
	return b, nil
}

// close removes the build directory (after commit, the image it replaced)
// and releases the locks. It is safe to call more than once.
func (b *build) close() error {
	err := os.RemoveAll(b.dir)
	if b.lock != nil {
		b.lock.Close()
		b.lock = nil
	}
	if b.gc != nil {
		b.gc.Close()
		b.gc = nil
	}
	return err
}

// commit writes img as the build's image.json and moves the build into place
// as img.Name, atomically replacing an image of that name (replaced). The
// replaced image lands in b.dir, which close removes.
func (s *Store) commit(b *build, img Image) (replaced bool, err error) {
	// The root moves out of the build first, under an id of its own: a
	// replaced image's root must not go with the replaced image.json.
	img.Root = randHex()
	if err := os.MkdirAll(filepath.Join(s.dir, rootsDir), 0o755); err != nil {
		return false, err
	}
	if err := os.Rename(filepath.Join(b.dir, "rootfs"), filepath.Join(s.dir, rootsDir, img.Root)); err != nil {
		return false, err
	}
	j, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(b.dir, "image.json"), j, 0o644); err != nil {
		return false, err
	}
	if err := os.Chmod(b.dir, 0o755); err != nil {
		return false, err
	}
	final := filepath.Join(s.dir, img.Name)
	err = unix.Renameat2(unix.AT_FDCWD, b.dir, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		replaced = true
		err = unix.Renameat2(unix.AT_FDCWD, b.dir, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE)
	}
	if errors.Is(err, unix.EINVAL) {
		// A filesystem without renameat2 flags: replace in two steps.
		trash := filepath.Join(s.dir, rmPrefix+img.Name+"-"+randHex())
		if err = os.Rename(final, trash); err == nil || errors.Is(err, fs.ErrNotExist) {
			replaced = err == nil
			err = os.Rename(b.dir, final)
		}
		_ = os.RemoveAll(trash)
	}
	if err != nil {
		return false, fmt.Errorf("install image %s: %w", img.Name, err)
	}
	return replaced, nil
}

// Remove removes the image called name and the blobs no other image uses. It
// does not check whether sandboxes use the image: the caller does. Removing
// an image that does not exist is a NotFound error.
func (s *Store) Remove(ctx context.Context, name string) error {
	if !ValidName(name) {
		return errdefs.New(errdefs.InvalidArgument, "bad image name %q", name)
	}
	if _, err := os.Lstat(filepath.Join(s.dir, name, "image.json")); errors.Is(err, fs.ErrNotExist) {
		return errdefs.New(errdefs.NotFound, "no image %q: see `clade image ls`", name)
	}
	// Rename first, so the image disappears at once and a crash midway
	// leaves only a directory cleanup removes.
	trash := filepath.Join(s.dir, rmPrefix+name+"-"+randHex())
	if err := os.Rename(filepath.Join(s.dir, name), trash); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	// The image is gone either way; unused blobs only cost disk.
	if err := s.gc(); err != nil {
		s.log.Warn("image blob garbage collection", "err", err)
	}
	return nil
}

// gc removes blobs no image references. It runs only when no build holds
// .gc.lock (a build's blobs are referenced by no image yet); blobs it leaves
// then are collected by a later Remove or NewStore.
func (s *Store) gc() error {
	lock, err := s.lockGC(unix.LOCK_EX | unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	blobs, err := os.ReadDir(filepath.Join(s.dir, blobsDir, "sha256"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	used := map[string]bool{}
	imgs, err := s.readAll()
	if err != nil {
		return err // better to keep every blob than to lose ones an image uses
	}
	for _, img := range imgs {
		for _, l := range img.Layers {
			used[strings.TrimPrefix(l, "sha256:")] = true
		}
	}
	for _, b := range blobs {
		if !used[b.Name()] {
			if err := os.Remove(filepath.Join(s.dir, blobsDir, "sha256", b.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (s *Store) lockGC(how int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(s.dir, gcLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (s *Store) blobPath(h v1.Hash) string {
	return filepath.Join(s.dir, blobsDir, h.Algorithm, h.Hex)
}

// layerSource is one layer of an image being installed.
type layerSource struct {
	digest v1.Hash // zero if only known once read
	size   int64   // bytes open returns; 0 if unknown
	open   func() (io.ReadCloser, error)
}

// addLayer applies layer l to rootfs: from blobs/ if the store has it,
// otherwise from l.open, storing the blob on the way (one pass over the
// bytes). It returns the blob's digest and whether it came from the store.
func (s *Store) addLayer(ctx context.Context, b *build, rootfs string, l layerSource, count func(int64)) (v1.Hash, bool, error) {
	if l.digest.Hex != "" {
		if f, err := os.Open(s.blobPath(l.digest)); err == nil {
			defer f.Close()
			if fi, err := f.Stat(); err == nil && (l.size == 0 || fi.Size() == l.size) {
				count(fi.Size())
				return l.digest, true, applyBlob(rootfs, &ctxReader{ctx, f})
			}
		}
	}
	rc, err := l.open()
	if err != nil {
		return v1.Hash{}, false, err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(b.dir, "blob-")
	if err != nil {
		return v1.Hash{}, false, err
	}
	defer tmp.Close()
	h := sha256.New()
	r := io.TeeReader(&ctxReader{ctx, rc}, io.MultiWriter(tmp, h, countWriter(count)))
	err = applyBlob(rootfs, r)
	if err == nil {
		// The rest after the tar's end: padding, compression trailer.
		_, err = io.Copy(io.Discard, r)
	}
	if err != nil {
		if ctx.Err() != nil {
			return v1.Hash{}, false, ctx.Err()
		}
		return v1.Hash{}, false, err
	}
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	if l.digest.Hex != "" && got != l.digest {
		return v1.Hash{}, false, errdefs.New(errdefs.InvalidArgument, "layer %s: content has digest %s", l.digest, got)
	}
	if err := tmp.Close(); err != nil {
		return v1.Hash{}, false, err
	}
	if err := os.MkdirAll(filepath.Dir(s.blobPath(got)), 0o755); err != nil {
		return v1.Hash{}, false, err
	}
	// Rename is atomic: a concurrent build storing the same blob wins or
	// loses the race with identical bytes.
	return got, false, os.Rename(tmp.Name(), s.blobPath(got))
}

// ctxReader fails reads once ctx is done, so a cancelled pull or import
// stops mid-layer.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type countWriter func(int64)

func (c countWriter) Write(p []byte) (int, error) {
	c(int64(len(p)))
	return len(p), nil
}

func randHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// GCRoots removes the installed root filesystems that no image names and
// that are not in inUse (root directories that sandboxes or snapshots still
// stand on). Like blob collection it gives way to builds in flight.
func (s *Store) GCRoots(inUse map[string]bool) error {
	lock, err := s.lockGC(unix.LOCK_EX | unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	roots, err := os.ReadDir(filepath.Join(s.dir, rootsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	named := map[string]bool{}
	imgs, err := s.readAll()
	if err != nil {
		return err
	}
	for _, img := range imgs {
		named[img.Root] = true
	}
	var errs []error
	for _, r := range roots {
		p := filepath.Join(s.dir, rootsDir, r.Name())
		if !named[r.Name()] && !inUse[p] {
			errs = append(errs, os.RemoveAll(p))
		}
	}
	return errors.Join(errs...)
}

// readAll reads every image's image.json. Unlike List it fails on one it
// cannot read: collectors must not take that image's blobs or root.
func (s *Store) readAll() ([]Image, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, e := range ents {
		if !e.IsDir() || !ValidName(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name(), "image.json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var img Image
		if err == nil {
			err = json.Unmarshal(b, &img)
		}
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", e.Name(), err)
		}
		out = append(out, img)
	}
	return out, nil
}
