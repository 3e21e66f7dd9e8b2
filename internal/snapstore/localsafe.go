package snapstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// A directory store is shared (a network mount, say), and whoever can
// write it is not trusted further than whoever can write a bucket: what
// is found under its root is read as a regular file or not at all. A
// symlink there (anywhere in an object's path) is not followed, a FIFO
// does not block the reader, a device or socket is not opened: each is
// refused with an error that names it (ErrNotRegular). A listing (a
// root's refs) skips what is not a regular file, and logs it.

// ErrNotRegular marks an object path of a directory store that holds
// something other than a regular file.
var ErrNotRegular = errors.New("not a regular file")

// SetLog sets where the store logs what it skips (entries in its
// directory that are not regular files). Called before use.
func (l *Local) SetLog(log *slog.Logger) { l.log = log }

func (l *Local) logger() *slog.Logger {
	if l.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.log
}

// notRegular is the refusal of the object at p, of type what.
func (l *Local) notRegular(p, what string) error {
	return errdefs.Wrap(errdefs.Conflict, fmt.Errorf("object store %s: %s is %s, %w: refused (only clade's own files belong there)", l.root, p, what, ErrNotRegular))
}

// openObject opens the object at p (a path under the store's root) for
// reading: no symlink in its path is followed (openat2 from the root with
// RESOLVE_NO_SYMLINKS and RESOLVE_BENEATH; each name of the path opened
// in turn with O_NOFOLLOW where the kernel, or a seccomp filter, refuses
// openat2), a FIFO does not block the open
// (O_NONBLOCK, cleared once it is known to be a regular file), and only a
// regular file is returned. A missing object is fs.ErrNotExist.
func (l *Local) openObject(p string) (*os.File, error) {
	rel, err := filepath.Rel(l.root, p)
	if err != nil || !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("object store %s: %s is not under it", l.root, p)
	}
	root, err := l.openDir(l.root, unix.O_PATH)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := openBeneath(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC)
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return nil, l.notRegular(p, "a symlink or under one")
	case errors.Is(err, unix.ENXIO):
		return nil, l.notRegular(p, "a socket")
	case err != nil:
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, l.notRegular(p, fileType(st.Mode))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fcntl", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// openat2 is unix.Openat2 (a test stands in a kernel without it).
var openat2 = unix.Openat2

// openBeneath opens rel (a local path) beneath directory fd root with
// flags, following no symlink on the way: openat2 with
// RESOLVE_NO_SYMLINKS and RESOLVE_BENEATH, or, where the kernel or a
// seccomp filter refuses openat2 (ENOSYS, EPERM), each name in turn
// (openatNoFollow).
func openBeneath(root int, rel string, flags int) (int, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = openat2(root, rel, &unix.OpenHow{Flags: uint64(flags),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
		return err
	})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		fd, err = openatNoFollow(root, rel, flags)
	}
	return fd, err
}

// openatNoFollow opens rel (a local path) beneath directory fd root with
// flags, as openat2's RESOLVE_NO_SYMLINKS would: each directory of the
// path is opened with O_NOFOLLOW in turn (a symlink among them is ELOOP,
// or ENOTDIR from O_DIRECTORY on one), then its last name with flags.
func openatNoFollow(root int, rel string, flags int) (int, error) {
	names := strings.Split(filepath.Clean(rel), "/")
	dir := root
	closeDir := func() {
		if dir != root {
			unix.Close(dir)
		}
	}
	defer closeDir()
	for _, name := range names[:len(names)-1] {
		if name == ".." || name == "." || name == "" {
			return -1, unix.EXDEV
		}
		var next int
		err := ignoringEINTR(func() (err error) {
			next, err = unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			return err
		})
		if errors.Is(err, unix.ENOTDIR) && isSymlink(dir, name) {
			// O_PATH|O_NOFOLLOW opens the link itself, which is no
			// directory: refused as under a symlink.
			return -1, unix.ELOOP
		}
		if err != nil {
			return -1, err
		}
		closeDir()
		dir = next
	}
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(dir, names[len(names)-1], flags, 0)
		return err
	})
	return fd, err
}

// readObject reads the object at p whole, up to limit bytes.
func (l *Local) readObject(p string, limit int64) ([]byte, error) {
	f, err := l.openObject(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("object store %s: %s is over %d bytes", l.root, p, limit)
	}
	return b, err
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return "of an unknown type"
}

// fetchObject links (or clones, or copies) the object at src to dst,
// making dst's parent: the very file openObject checked, never what a
// symlink at src names.
func (l *Local) fetchObject(src, dst string) error {
	in, err := l.openObject(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	// A link of the open file itself (AT_EMPTY_PATH: needs
	// CAP_DAC_READ_SEARCH, which a root daemon has); else a copy.
	if unix.Linkat(int(in.Fd()), "", unix.AT_FDCWD, dst, unix.AT_EMPTY_PATH) == nil {
		return nil
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Writes, deletes, renames and listings go through directories opened as
// the objects are (openDir: no symlink anywhere on the way), and act on
// a name in such a directory (the *at calls): a symlink planted as one of
// the store's directories (roots, a root's, its refs, image-roots) is
// refused, never followed out of the store.

// openDir opens the directory p (the store's root, or one under it) with
// flags (O_PATH or O_RDONLY, with O_DIRECTORY added), following no
// symlink under the root. A missing one is fs.ErrNotExist.
func (l *Local) openDir(p string, flags int) (int, error) {
	rel, err := filepath.Rel(l.root, p)
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		return -1, fmt.Errorf("object store %s: %s is not under it", l.root, p)
	}
	flags |= unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	var fd int
	if rel == "." {
		// The root itself is the operator's (a symlink there is theirs).
		err = ignoringEINTR(func() (err error) {
			fd, err = unix.Open(l.root, flags&^unix.O_NOFOLLOW, 0)
			return err
		})
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: l.root, Err: err}
		}
		return fd, nil
	}
	root, err := l.openDir(l.root, unix.O_PATH)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	fd, err = openBeneath(root, rel, flags)
	if errors.Is(err, unix.ENOTDIR) && isSymlink(root, rel) {
		err = unix.ELOOP // O_NOFOLLOW|O_DIRECTORY on a symlink (the fallback's last name)
	}
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return -1, l.notRegular(p, "a symlink or under one")
	case err != nil:
		return -1, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

// isSymlink reports whether rel under dir is a symlink (itself, not
// followed; its directories followed, as this only names an error
// already had).
func isSymlink(dir int, rel string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dir, rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// at runs f on p's directory (openDir) and p's last name.
func (l *Local) at(p string, f func(dir int, name string) error) error {
	dir, err := l.openDir(filepath.Dir(p), unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	err = ignoringEINTR(func() error { return f(dir, filepath.Base(p)) })
	if errno, ok := err.(unix.Errno); ok {
		return &fs.PathError{Op: "at", Path: p, Err: errno}
	}
	return err
}

// removeObject removes the file at p (a missing one is no error).
func (l *Local) removeObject(p string) error {
	err := l.at(p, func(dir int, name string) error { return unix.Unlinkat(dir, name, 0) })
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// removeEmptyDir removes the directory at p if it is empty.
func (l *Local) removeEmptyDir(p string) error {
	return l.at(p, func(dir int, name string) error { return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR) })
}

// renameObject renames src to dst (replacing it), both under the root.
func (l *Local) renameObject(src, dst string) error {
	return l.at(src, func(sdir int, sname string) error {
		return l.at(dst, func(ddir int, dname string) error { return unix.Renameat(sdir, sname, ddir, dname) })
	})
}

// linkObject links dst to the file src (a symlink at src is linked as
// the link, never followed); an existing dst is fs.ErrExist.
func (l *Local) linkObject(src, dst string) error {
	return l.at(src, func(sdir int, sname string) error {
		return l.at(dst, func(ddir int, dname string) error { return unix.Linkat(sdir, sname, ddir, dname, 0) })
	})
}

// mkdirAll makes the directory p and its parents under the root, each
// made or opened without following a symlink.
func (l *Local) mkdirAll(p string) error {
	rel, err := filepath.Rel(l.root, p)
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		return fmt.Errorf("object store %s: %s is not under it", l.root, p)
	}
	cur := l.root
	for _, name := range strings.Split(rel, string(filepath.Separator)) {
		if name == "." {
			continue
		}
		err := l.at(filepath.Join(cur, name), func(dir int, name string) error { return unix.Mkdirat(dir, name, 0o700) })
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		cur = filepath.Join(cur, name)
	}
	// The whole path, checked once made: no symlink on it.
	fd, err := l.openDir(p, unix.O_PATH)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// createObject makes a new file in the directory dir (made if needed),
// named prefix and a random suffix, open for writing.
func (l *Local) createObject(dir, prefix string) (*os.File, error) {
	if err := l.mkdirAll(dir); err != nil {
		return nil, err
	}
	for {
		name := prefix + strconv.FormatUint(rand.Uint64(), 36)
		var fd int
		err := l.at(filepath.Join(dir, name), func(d int, n string) (err error) {
			fd, err = unix.Openat(d, n, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			return err
		})
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
	}
}

// listDir calls each on the entries of the directory p (opened by
// openDir), read a batch at a time, until each says stop: a directory
// with many entries planted is neither read whole into memory nor past
// the entry sought. A missing one is fs.ErrNotExist.
func (l *Local) listDir(p string, each func(fs.DirEntry) (stop bool)) error {
	fd, err := l.openDir(p, unix.O_RDONLY)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	for {
		ents, err := f.ReadDir(256)
		for _, e := range ents {
			if each(e) {
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
