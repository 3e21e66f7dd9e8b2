package image

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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

// Layout of the image directory:
//
//	.rootfs/<id>/          root filesystems, each under its own id
//	blobs/sha256/<hex>     layer blobs as pulled, shared between images
//	.build-<name>-<rand>/  an image being built, flocked by its builder
//	.rm-<name>-<rand>/     an image being removed
//	.gc.lock               shared by builds, exclusive for garbage collection
//	<name>/image.json      a descriptor: the default image, and images of
//	                       versions before the store kept image metadata
//	<name>/rootfs/, .roots/<id>/  the roots of those descriptors
const (
	blobsDir = "blobs"
	// rootfsDir holds every root filesystem this version installs. An
	// image names its current root; replacing the image points it at a new
	// one, and the old root lives on while sandboxes or snapshots use it.
	// It is not .roots/, where earlier versions kept theirs: those collect
	// every root there that no descriptor names, and would take ours from
	// a shared image directory.
	rootfsDir = ".rootfs"
	// rootsDir holds the roots of earlier versions' descriptors.
	rootsDir    = ".roots"
	buildPrefix = ".build-"
	rmPrefix    = ".rm-"
	gcLock      = ".gc.lock"
)

// cleanup removes what killed builds and removals left behind. A build
// another live process holds is left alone. Unused blobs are the caller's
// to collect (GCBlobs): only it knows which images exist.
func (s *Store) cleanup() {
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		p := filepath.Join(s.dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), rmPrefix):
			_ = os.RemoveAll(p)
		case strings.HasPrefix(e.Name(), buildPrefix) && !isBuiltinBuild(e.Name()) && !builtinLockExists(s.dir, e.Name()):
			// EnsureBuiltin's builds have their own lock and cleanup,
			// also those of recipes this binary does not register (a
			// test binary without the code interpreter's package): the
			// lock file beside the images tells them.
			if f, err := os.Open(p); err == nil {
				if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
					_ = os.RemoveAll(p)
				}
				f.Close()
			}
		}
	}
}

// builtinLockExists reports whether build (a .build-NAME entry) has the
// lock file of EnsureBuiltin's builds of NAME beside it: a built-in
// image's build, maybe of a recipe this binary does not know, which only
// EnsureBuiltin (under that lock) may remove.
func builtinLockExists(dir, build string) bool {
	_, err := os.Lstat(filepath.Join(dir, "."+strings.TrimPrefix(build, buildPrefix)+".lock"))
	return err == nil
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

// commit moves the build's root filesystem to a root of its own under
// .rootfs/ and returns img naming it. Nothing else changes on disk: which
// image names the root is the caller's record.
func (s *Store) commit(b *build, img Image) (Image, error) {
	img.Root = ""
	img.RootFS = filepath.Join(s.dir, rootfsDir, randHex())
	if err := os.MkdirAll(filepath.Join(s.dir, rootfsDir), 0o755); err != nil {
		return Image{}, err
	}
	if err := addMountPoints(filepath.Join(b.dir, "rootfs")); err != nil {
		return Image{}, fmt.Errorf("install image %s: %w", img.Name, err)
	}
	if s.OnRoot != nil {
		if err := s.OnRoot(img.RootFS); err != nil {
			return Image{}, fmt.Errorf("install image %s: %w", img.Name, err)
		}
	}
	if err := os.Rename(filepath.Join(b.dir, "rootfs"), img.RootFS); err != nil {
		return Image{}, fmt.Errorf("install image %s: %w", img.Name, err)
	}
	return img, nil
}

// RemoveRoot removes a root filesystem under .rootfs/ (one that commit
// made). Removing a missing one is not an error; a path elsewhere is.
func (s *Store) RemoveRoot(rootfs string) error {
	if filepath.Dir(rootfs) != filepath.Join(s.dir, rootfsDir) {
		return fmt.Errorf("%s is not an image root of %s", rootfs, s.dir)
	}
	return os.RemoveAll(rootfs)
}

// GCBlobs removes the layer blobs not in used (digests, "sha256:..."). It
// runs only when no build holds .gc.lock (a build's blobs are referenced by
// no image yet); blobs it leaves then are collected by a later call. Blobs
// are only a cache of what roots were made from: a daemon sharing the image
// directory that loses one downloads it again.
func (s *Store) GCBlobs(used map[string]bool) error {
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
	for _, b := range blobs {
		if !used["sha256:"+b.Name()] {
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

// mountPoints are the directories every sandbox's engine mounts over (the
// gvisor engine's /.clade/bin and /.clade/run): made in a root before it
// is published, so that runsc never makes them in a shared image root and
// a sandbox without volumes needs no view of its own. An image that has
// something else there (a file, a symlink) is left as it is.
var mountPoints = []string{".clade", ".clade/bin", ".clade/run"}

// addMountPoints makes mountPoints in rootfs, never through a symlink.
func addMountPoints(rootfs string) error {
	for _, p := range mountPoints {
		err := os.Mkdir(filepath.Join(rootfs, p), 0o755)
		if err != nil && !os.IsExist(err) {
			return err
		}
		if fi, err := os.Lstat(filepath.Join(rootfs, p)); err != nil || !fi.IsDir() {
			return nil // not a directory of the image's own: leave it
		}
	}
	return nil
}
