package snapstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
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
	var root int
	if err := ignoringEINTR(func() (err error) {
		root, err = unix.Open(l.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, &fs.PathError{Op: "open", Path: l.root, Err: err}
	}
	defer unix.Close(root)
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	var fd int
	err = ignoringEINTR(func() (err error) {
		fd, err = openat2(root, rel, &unix.OpenHow{Flags: flags,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
		return err
	})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No openat2 (an old kernel, or a seccomp filter that refuses it):
		// each name of the path opened in turn, none followed if a symlink.
		fd, err = openatNoFollow(root, rel, flags)
	}
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
		if errors.Is(err, unix.ENOTDIR) {
			// A symlink (O_PATH|O_NOFOLLOW opens the link itself, which is
			// no directory) or a file: refused as under a symlink when it is one.
			var st unix.Stat_t
			if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, unix.ELOOP
			}
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
