package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// MaxEntrySize bounds one layer entry (tarx.CheckHeader enforces it), so a
// few compressed bytes cannot ask for an unbounded write.
const MaxEntrySize = tarx.MaxEntrySize

const (
	maxNameLen  = 4096 // PATH_MAX: longer names cannot be created anyway
	maxSymlinks = 40   // Linux's MAXSYMLINKS

	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // aufs bookkeeping: ".wh..wh.plnk", ".wh..wh.aufs"
	whiteoutOpaque = ".wh..wh..opq"
)

// ApplyLayer applies one uncompressed OCI layer tar stream to the image root
// directory root, on top of the layers applied before it.
//
// It follows the OCI image spec: ".wh.NAME" removes NAME from lower layers and
// ".wh..wh..opq" removes everything lower layers put in its directory (entries
// of this layer survive both, in any order); hardlinks, symlinks, modes
// (set-id bits included), ownership (when running as root), xattrs (where the
// filesystem takes them) and mtimes are kept.
//
// Nothing is ever written outside root. Paths resolve as they will inside the
// sandbox: a symlink met as a parent is followed with root as "/", so an
// absolute target stays in the image. These are refused with an
// InvalidArgument error: names or symlinks met as parents whose ".." climbs
// above root; device and fifo nodes; sparse files; entries larger than
// MaxEntrySize; hardlinks to missing files or directories; names over 4096
// bytes. An entry never writes through whatever it replaces: a symlink or
// hardlink already at its name is replaced, not followed. Entries before a
// refused one stay applied.
func ApplyLayer(root string, r io.Reader) error {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer rt.Close()
	a := &applier{
		root:     rt,
		chown:    os.Geteuid() == 0,
		resolved: map[string]string{},
		added:    map[string]bool{},
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", streamErr(err))
		}
		if err := a.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %.256q: %w", hdr.Name, err)
		}
	}
	return a.finish()
}

// applyBlob applies a layer blob as stored in a registry: gzip, zstd or
// plain tar, told apart by their magic bytes rather than the media type,
// which registries and tools get wrong often enough.
func applyBlob(root string, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("gzip layer: %w", err))
		}
		defer zr.Close()
		return ApplyLayer(root, zr)
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("zstd layer: %w", err))
		}
		defer zr.Close()
		return ApplyLayer(root, zr)
	}
	return ApplyLayer(root, br)
}

type applier struct {
	root  *os.Root
	chown bool
	// resolved caches parent directories already resolved (key: the path
	// as named, value: the real path in root). Removing or replacing a
	// directory or symlink drops the whole cache.
	resolved map[string]string
	// added holds the real paths this layer created: whiteouts only hide
	// what lower layers put there.
	added    map[string]bool
	deferred []dirMeta
}

// dirMeta is a directory's metadata, applied once the layer is done so
// filling the directory does not bump its mtime or need its write bit.
type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.InvalidArgument, format, args...)
}

// streamErr classifies a read error: a malformed or truncated layer is the
// image's fault, a broken connection is not.
func streamErr(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) {
		return errdefs.Wrap(errdefs.InvalidArgument, err)
	}
	return err
}

func (a *applier) entry(hdr *tar.Header, r io.Reader) error {
	// Validate everything the header says before touching the disk.
	if skip, err := tarx.CheckHeader(hdr); skip || err != nil {
		return err
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil // the root's metadata is the store's
	}
	dir, base := path.Split(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteout(dir, base)
	}
	dir, err = a.resolve(dir, true)
	if err != nil {
		return err
	}
	p := path.Join(dir, base)

	switch hdr.Typeflag {
	case tar.TypeDir:
		err = a.dir(hdr, p)
	case tar.TypeSymlink:
		err = a.symlink(hdr, p)
	case tar.TypeLink:
		err = a.link(hdr, p)
	default:
		err = a.file(hdr, p, r)
	}
	// p and its parents are this layer's: a whiteout in it must not hide
	// them, and an opaque directory above them keeps them.
	for q := p; err == nil && q != "." && !a.added[q]; q = path.Dir(q) {
		a.added[q] = true
	}
	return err
}

// sparse reports whether hdr is a GNU sparse file, old style or PAX.

// cleanName validates a header name and returns it as a clean slash path
// relative to root, "." for root itself. A leading "/" means the image root,
// as layers written by some tools have it; ".." above root is refused rather
// than clamped, since no honest layer has one.
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", invalid("empty name")
	case len(name) > maxNameLen:
		return "", invalid("name longer than %d bytes", maxNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return "", invalid("NUL in name")
	}
	depth := 0
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
		case "..":
			if depth--; depth < 0 {
				return "", invalid("path escapes the image")
			}
		default:
			depth++
		}
	}
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if name == "" {
		return ".", nil
	}
	return name, nil
}

// resolve returns the real path in root of the directory dir ("" or "a/b/"),
// following symlinks as the sandbox would see them: absolute targets start at
// root, and ".." above root is refused. Missing directories are created if
// create is set; a missing one is an fs.ErrNotExist error otherwise.
func (a *applier) resolve(dir string, create bool) (string, error) {
	dir = strings.Trim(dir, "/")
	if dir == "" {
		return ".", nil
	}
	if r, ok := a.resolved[dir]; ok {
		return r, nil
	}
	parts := strings.Split(dir, "/")
	cur := "" // the real path so far; "" is root
	links := 0
	for len(parts) > 0 {
		c := parts[0]
		parts = parts[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if cur == "" {
				return "", invalid("symlink in %.256q climbs out of the image", dir)
			}
			if cur = path.Dir(cur); cur == "." {
				cur = ""
			}
			continue
		}
		next := path.Join(cur, c)
		fi, err := a.root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := a.root.Mkdir(next, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", invalid("too many levels of symlinks in %.256q", dir)
			}
			target, err := a.root.Readlink(next)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				cur = ""
			}
			parts = append(strings.Split(target, "/"), parts...)
			continue
		case !fi.IsDir():
			return "", errdefs.Wrap(errdefs.InvalidArgument, &fs.PathError{Op: "parent", Path: next, Err: syscall.ENOTDIR})
		}
		cur = next
	}
	if cur == "" {
		cur = "."
	}
	a.resolved[dir] = cur
	return cur, nil
}

// whiteout applies a ".wh." entry in the directory dir (as named).
func (a *applier) whiteout(dir, base string) error {
	if strings.HasPrefix(base, whiteoutMeta) && base != whiteoutOpaque {
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if base != whiteoutOpaque && (target == "" || target == "." || target == "..") {
		return invalid("bad whiteout")
	}
	d, err := a.resolve(dir, false)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	if base == whiteoutOpaque {
		return a.opaque(d)
	}
	p := path.Join(d, target)
	if a.added[p] {
		return nil
	}
	return a.remove(p)
}

// opaque removes everything under dir that this layer did not add.
func (a *applier) opaque(dir string) error {
	f, err := a.root.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) {
		return nil
	}
	if err != nil {
		return err
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		switch {
		case !a.added[p]:
			err = a.remove(p)
		case e.IsDir():
			err = a.opaque(p)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// remove deletes p, whatever it is, without following it.
func (a *applier) remove(p string) error {
	fi, err := a.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
		clear(a.resolved) // a cached path may run through p
	}
	return a.root.RemoveAll(p)
}

// clear makes way for a new entry at p, so an existing symlink or hardlink
// there is replaced rather than written through. Only a directory entry
// keeps an existing directory (keep).
func (a *applier) clear(p string, dir bool) (keep bool, err error) {
	fi, err := a.root.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case fi.IsDir() && dir:
		return true, nil
	}
	return false, a.remove(p)
}

func (a *applier) dir(hdr *tar.Header, p string) error {
	keep, err := a.clear(p, true)
	if err != nil {
		return err
	}
	if !keep {
		if err := a.root.Mkdir(p, 0o700); err != nil {
			return err
		}
	}
	if a.chown {
		if err := a.root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := a.xattrs(hdr, p); err != nil {
		return err
	}
	a.deferred = append(a.deferred, dirMeta{p, a.mode(hdr), hdr.ModTime})
	return nil
}

func (a *applier) file(hdr *tar.Header, p string, r io.Reader) error {
	if _, err := a.clear(p, false); err != nil {
		return err
	}
	// O_EXCL: os.Root follows a final symlink without it, so if anything
	// reappeared since clear, fail rather than write through it.
	f, err := a.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err = io.Copy(f, r); err != nil {
		err = streamErr(err)
	}
	if err == nil && a.chown {
		err = f.Chown(hdr.Uid, hdr.Gid) // before Chmod: chown clears set-id bits
	}
	if err == nil {
		err = f.Chmod(a.mode(hdr))
	}
	if err == nil {
		// After chown, which drops security.capability.
		err = a.fxattrs(hdr, int(f.Fd()))
	}
	if err == nil {
		err = futimes(int(f.Fd()), hdr.ModTime)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (a *applier) symlink(hdr *tar.Header, p string) error {
	if _, err := a.clear(p, false); err != nil {
		return err
	}
	if err := a.root.Symlink(hdr.Linkname, p); err != nil {
		return err
	}
	if a.chown {
		if err := a.root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := a.xattrs(hdr, p); err != nil {
		return err
	}
	return a.atParent(p, func(dirfd int, base string) error {
		ts := []unix.Timespec{timespec(hdr.ModTime), timespec(hdr.ModTime)}
		return unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

func (a *applier) link(hdr *tar.Header, p string) error {
	name, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hardlink target: %w", err)
	}
	dir, base := path.Split(name)
	dir, err = a.resolve(dir, false)
	target := path.Join(dir, base)
	var fi fs.FileInfo
	if err == nil {
		fi, err = a.root.Lstat(target)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return invalid("hardlink target %.256q does not exist", hdr.Linkname)
	case err != nil:
		return fmt.Errorf("hardlink target: %w", err)
	case fi.IsDir():
		return invalid("hardlink target %.256q is a directory", hdr.Linkname)
	case target == p:
		return nil // clearing p first would lose the file
	}
	if _, err := a.clear(p, false); err != nil {
		return err
	}
	// A target that is itself a symlink is linked, not followed.
	return a.root.Link(target, p)
}

func (a *applier) mode(hdr *tar.Header) fs.FileMode {
	m := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if !a.chown {
		// Set-id bits on a file the caller owns would hand the caller's
		// privileges to whoever wrote the layer.
		m &^= fs.ModeSetuid | fs.ModeSetgid
	}
	return m
}

// xattrs sets hdr's extended attributes on p, not following it.
func (a *applier) xattrs(hdr *tar.Header, p string) error {
	if !hasXattrs(hdr) {
		return nil
	}
	return a.atParent(p, func(dirfd int, base string) error {
		// Through /proc the parent is the fd os.Root resolved, and
		// lsetxattr does not follow base: works for symlinks too.
		at := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + base
		return setXattrs(hdr, func(k string, v []byte) error { return unix.Lsetxattr(at, k, v, 0) })
	})
}

func (a *applier) fxattrs(hdr *tar.Header, fd int) error {
	return setXattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) })
}

func hasXattrs(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			return true
		}
	}
	return false
}

// setXattrs applies hdr's xattrs with set, skipping ones the filesystem
// does not support or lets no one set (trusted.* in a user namespace,
// user.* on a symlink): an image is still usable without them.
func setXattrs(hdr *tar.Header, set func(string, []byte) error) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		err := set(name, []byte(v))
		if err != nil && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("set xattr %.64q: %w", name, err)
		}
	}
	return nil
}

// atParent runs fn with an fd of p's parent directory, opened through root.
func (a *applier) atParent(p string, fn func(dirfd int, base string) error) error {
	d, err := a.root.OpenFile(path.Dir(p), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := fn(int(d.Fd()), path.Base(p)); err != nil {
		return &fs.PathError{Op: "at", Path: p, Err: err}
	}
	return nil
}

func futimes(fd int, mtime time.Time) error {
	if mtime.IsZero() {
		return nil
	}
	ts := []unix.Timespec{timespec(mtime), timespec(mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ts, 0)
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// finish applies the deferred directory metadata, latest entry first: that
// reaches children before a parent's mode can lock them away, and the latest
// header for a directory listed twice wins.
func (a *applier) finish() error {
	done := map[string]bool{}
	for _, d := range slices.Backward(a.deferred) {
		if done[d.name] {
			continue
		}
		done[d.name] = true
		// A later entry may have removed the directory or replaced it or
		// a parent with a symlink; never chmod through one.
		if r, err := a.resolve(path.Dir(d.name), false); err != nil || r != path.Dir(d.name) {
			continue
		}
		f, err := a.root.OpenFile(d.name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		err = f.Chmod(d.mode)
		if err == nil {
			err = futimes(int(f.Fd()), d.mtime)
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
