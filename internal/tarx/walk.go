package tarx

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Policy is what differs between extracting a copy (Extract) and applying an
// image layer (internal/image): where each entry goes. Walk does the rest
// the same way for both: header checks, replacing rather than writing
// through what is in the way, modes, ownership, xattrs, times, and directory
// metadata applied at the end.
type Policy interface {
	// Place returns where hdr's entry goes: a clean slash path relative to
	// the tree's root, its parents made and checked. skip is true for an
	// entry that writes nothing more (the root itself, or a whiteout the
	// policy applied). Errors are InvalidArgument for a refused entry.
	Place(t *Tree, hdr *tar.Header) (p string, skip bool, err error)
	// LinkTarget returns where the target of the hardlink hdr is, relative
	// to the root; an fs.ErrNotExist error if a directory on the way is
	// missing.
	LinkTarget(t *Tree, hdr *tar.Header) (string, error)
	// ParentsIntact reports whether the parents of p are still the real
	// directories they were when p was written: a directory's metadata is
	// applied at the end only then, never through a symlink.
	ParentsIntact(t *Tree, p string) bool
	// Removed is told that a directory or symlink at p is gone (paths the
	// policy cached through it are stale).
	Removed(p string)
	// Wrote is told that an entry was written at p.
	Wrote(p string)
}

// WalkOptions tune Walk.
type WalkOptions struct {
	// Chown applies the uid and gid from the headers; only as root.
	Chown bool
	// Owner, when set with Chown, replaces every header's uid and gid.
	Owner *Owner
	// Xattrs applies the headers' SCHILY.xattr records, skipping those the
	// filesystem does not support or lets no one set.
	Xattrs bool
	// What names an entry in errors: "tar entry", "layer entry".
	What string
	// StreamErr classifies an error reading the stream; nil classifies
	// malformed and truncated tar as InvalidArgument.
	StreamErr func(error) error
	// Limit, when set, is called with each entry's number (from 1) before
	// the entry is written; an error it returns ends the walk as it is.
	Limit func(n int) error
}

// Tree is the directory a Walk writes to.
type Tree struct {
	// Root is the directory; every path resolves inside it.
	Root   *os.Root
	opts   WalkOptions
	policy Policy
	// deferred directory metadata is applied once the stream is done, so
	// filling a directory neither needs its write permission nor bumps its
	// mtime afterwards.
	deferred []dirMeta
	// pdir is the parent directory of the last file written (dirName,
	// relative to Root; dirFD its descriptor), kept open for the next one
	// (see parentDir).
	pdir    *os.File
	dirName string
	dirFD   int
}

type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

// Walk writes the tar stream r into the existing directory dir, entry by
// entry, where p says. Nothing is written outside dir: os.Root resolves
// every path component by component with O_NOFOLLOW (openat), so even a
// concurrent attacker swapping directories for symlinks cannot make an
// operation land outside it. Headers are checked by CheckHeader first.
// Entries before a refused one stay written. A missing dir is a NotFound
// error.
func Walk(dir string, r io.Reader, opts WalkOptions, p Policy) error {
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.NotFound, err)
	}
	if err != nil {
		return err
	}
	defer root.Close()
	if opts.StreamErr == nil {
		opts.StreamErr = streamErr
	}
	if opts.What == "" {
		opts.What = "tar entry"
	}
	opts.Chown = opts.Chown && os.Geteuid() == 0
	t := &Tree{Root: root, opts: opts, policy: p, dirFD: -1}
	defer t.dropDir()
	tr := tar.NewReader(r)
	for n := 1; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", strings.TrimSuffix(opts.What, " entry"), opts.StreamErr(err))
		}
		if opts.Limit != nil {
			if err := opts.Limit(n); err != nil {
				return err
			}
		}
		if opts.Owner != nil {
			hdr.Uid, hdr.Gid = opts.Owner.UID, opts.Owner.GID
		}
		if err := t.entry(hdr, tr); err != nil {
			return noSpace(fmt.Errorf("%s %.256q: %w", opts.What, hdr.Name, err))
		}
	}
	return t.finish()
}

func (t *Tree) entry(hdr *tar.Header, r io.Reader) error {
	if skip, err := CheckHeader(hdr); skip || err != nil {
		return err
	}
	p, skip, err := t.policy.Place(t, hdr)
	if skip || err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = t.dir(hdr, p)
	case tar.TypeSymlink:
		err = t.symlink(hdr, p)
	case tar.TypeLink:
		err = t.link(hdr, p)
	default:
		err = t.file(hdr, p, r)
	}
	if err == nil {
		t.policy.Wrote(p)
	}
	return err
}

// Remove deletes p, whatever it is, without following it. A missing p is
// not an error.
func (t *Tree) Remove(p string) error {
	fi, err := t.Root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
		t.policy.Removed(p)
		if t.dirName == p || strings.HasPrefix(t.dirName, p+"/") || p == "." {
			t.dropDir()
		}
	}
	if !fi.IsDir() {
		return t.Root.Remove(p)
	}
	return t.Root.RemoveAll(p)
}

// clear makes way for a new entry at p. Anything there is removed rather
// than written through, so an existing symlink or hardlink cannot redirect
// the write. Only a directory entry keeps an existing directory (keep).
func (t *Tree) clear(p string, dir bool) (keep bool, err error) {
	fi, err := t.Root.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case fi.IsDir() && dir:
		return true, nil
	}
	return false, t.Remove(p)
}

func (t *Tree) dir(hdr *tar.Header, p string) error {
	keep, err := t.clear(p, true)
	if err != nil {
		return err
	}
	if !keep {
		// Owner-only until finish applies the header's mode.
		if err := t.Root.Mkdir(p, 0o700); err != nil {
			return err
		}
	}
	if t.opts.Chown {
		if err := t.Root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := t.xattrs(hdr, p); err != nil {
		return err
	}
	atime, mtime := times(hdr)
	t.deferred = append(t.deferred, dirMeta{p, t.mode(hdr), atime, mtime})
	return nil
}

func (t *Tree) file(hdr *tar.Header, p string, r io.Reader) error {
	// Created first and cleared only if something is in the way: a new
	// file (the common case) costs no Lstat. O_EXCL|O_NOFOLLOW: whatever is
	// at p, even a dangling symlink, makes the create fail, and is then
	// removed rather than written through.
	fd, err := t.create(p)
	if errors.Is(err, fs.ErrExist) {
		if _, err := t.clear(p, false); err != nil {
			return err
		}
		fd, err = t.create(p)
	}
	if err != nil {
		return err
	}
	// The open file is used through its descriptor alone: an *os.File of
	// a regular file costs four fcntls and an epoll_ctl that fails (Go
	// tries the poller on it), and under gVisor each is a trap.
	op := "write"
	if err = copyFile(fd, r); err != nil {
		err = t.opts.StreamErr(err)
	}
	if err == nil && t.opts.Chown {
		op = "fchown"
		err = ignoringEINTR(func() error { return unix.Fchown(fd, hdr.Uid, hdr.Gid) }) // before Chmod: chown clears set-id bits
	}
	if err == nil {
		op = "fchmod"
		err = ignoringEINTR(func() error { return unix.Fchmod(fd, sysMode(t.mode(hdr))) })
	}
	if err == nil && t.opts.Xattrs {
		// After chown, which drops security.capability.
		op = "fsetxattr"
		err = setXattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) })
	}
	if err == nil {
		op = "utimensat"
		atime, mtime := times(hdr)
		err = futimens(fd, atime, mtime)
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		op, err = "close", cerr
	}
	if err != nil {
		var pe *fs.PathError
		if _, ok := err.(syscall.Errno); ok || !errors.As(err, &pe) {
			err = &fs.PathError{Op: op, Path: p, Err: err}
		}
		// A file that failed half way (a broken stream, a full disk) is
		// not left behind half written.
		_ = t.Root.Remove(p)
	}
	return err
}

// noSpace makes err, if a full disk (no blocks or no inodes left: a file's
// create or a parent's mkdir fails too, not only a write) or an exhausted
// quota, a ResourceExhausted error saying what to do.
func noSpace(err error) error {
	if errdefs.Is(err, errdefs.ResourceExhausted) || !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
		return err
	}
	return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("%w: free some space and retry", err))
}

// create makes the new file p (O_EXCL, never following a final symlink)
// and returns its descriptor, opened for writing with mode 0600.
func (t *Tree) create(p string) (int, error) {
	dirfd, base, err := t.parentDir(p)
	if err != nil {
		return -1, err
	}
	var fd int
	err = ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return err
	})
	if err != nil {
		return -1, &fs.PathError{Op: "openat", Path: p, Err: err}
	}
	return fd, nil
}

// parentDir returns a descriptor of p's parent directory and p's last
// component. The directory is opened through the root (never through a
// symlink) and kept for the entries that follow in it: an archive lists a
// directory's files together, and reopening it for each costs an openat
// and a close per file. A directory moved elsewhere meanwhile takes what
// follows along, which gives the mover nothing: it needs write access to
// both places already. Tree.Remove drops it.
func (t *Tree) parentDir(p string) (int, string, error) {
	dir, base := path.Dir(p), path.Base(p)
	if t.pdir == nil || t.dirName != dir {
		t.dropDir()
		f, err := t.Root.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return -1, "", err
		}
		t.pdir, t.dirName, t.dirFD = f, dir, int(f.Fd())
	}
	return t.dirFD, base, nil
}

// dropDir closes the kept parent directory, if any.
func (t *Tree) dropDir() {
	if t.pdir != nil {
		t.pdir.Close()
		t.pdir, t.dirName, t.dirFD = nil, "", -1
	}
}

// sysMode is m in the bits of chmod(2).
func sysMode(m fs.FileMode) uint32 {
	o := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		o |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		o |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		o |= syscall.S_ISVTX
	}
	return o
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// copyBufSize is the size of the writes (and reads) of file contents: under
// gVisor every system call traps into the sentry, and 32 KiB writes (what
// io.Copy does) held a copy to a fifth of what 256 KiB ones reach.
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyFile writes what r has to the file fd in writes of up to copyBufSize
// bytes, each buffer filled before it is written. It returns r's error, if
// any, other than io.EOF (a truncated tar stream's io.ErrUnexpectedEOF
// stays).
func copyFile(fd int, r io.Reader) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := 0, error(nil)
		for n < len(buf) && rerr == nil {
			var m int
			m, rerr = r.Read(buf[n:])
			n += m
		}
		for b := buf[:n]; len(b) > 0; {
			m, err := unix.Write(fd, b)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			b = b[m:]
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// futimens sets the times of the open file fd (utimensat with no path: no
// lookup of /proc/self/fd, which costs gVisor a walk through its procfs).
func futimens(fd int, atime, mtime time.Time) error {
	ts := [2]unix.Timespec{timespec(atime), timespec(mtime)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func (t *Tree) symlink(hdr *tar.Header, p string) error {
	if _, err := t.clear(p, false); err != nil {
		return err
	}
	if err := t.Root.Symlink(hdr.Linkname, p); err != nil {
		return err
	}
	if t.opts.Chown {
		if err := t.Root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := t.xattrs(hdr, p); err != nil {
		return err
	}
	return t.chtimes(p, hdr)
}

func (t *Tree) link(hdr *tar.Header, p string) error {
	target, err := t.policy.LinkTarget(t, hdr)
	var fi fs.FileInfo
	if err == nil {
		fi, err = t.Root.Lstat(target)
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
	if _, err := t.clear(p, false); err != nil {
		return err
	}
	// A target that is itself a symlink is linked, not followed.
	return t.Root.Link(target, p)
}

func (t *Tree) mode(hdr *tar.Header) fs.FileMode {
	m := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if !t.opts.Chown {
		// A set-id file owned by the caller would hand the caller's
		// privileges to whoever wrote the archive.
		m &^= fs.ModeSetuid | fs.ModeSetgid
	}
	return m
}

// times returns the times an entry gets: the header's, its access time
// being its modification time when the header has none.
func times(hdr *tar.Header) (atime, mtime time.Time) {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime, hdr.ModTime
	}
	return hdr.AccessTime, hdr.ModTime
}

// xattrs sets hdr's extended attributes on p, not following it.
func (t *Tree) xattrs(hdr *tar.Header, p string) error {
	if !t.opts.Xattrs || !hasXattrs(hdr) {
		return nil
	}
	return t.atParent(p, func(dirfd int, base string) error {
		// Through /proc the parent is the fd os.Root resolved, and
		// lsetxattr does not follow base: works for symlinks too.
		at := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + base
		return setXattrs(hdr, func(k string, v []byte) error { return unix.Lsetxattr(at, k, v, 0) })
	})
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
// user.* on a symlink): the tree is still usable without them.
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
func (t *Tree) atParent(p string, fn func(dirfd int, base string) error) error {
	d, err := t.Root.OpenFile(path.Dir(p), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := fn(int(d.Fd()), path.Base(p)); err != nil {
		return &fs.PathError{Op: "at", Path: p, Err: err}
	}
	return nil
}

// chtimes sets p's times without following it if it is a symlink, which
// os.Root has no method for. A zero time is left unchanged.
func (t *Tree) chtimes(p string, hdr *tar.Header) error {
	atime, mtime := times(hdr)
	return t.atParent(p, func(dirfd int, base string) error {
		ts := []unix.Timespec{timespec(atime), timespec(mtime)}
		return unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
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
func (t *Tree) finish() error {
	done := map[string]bool{}
	for _, d := range slices.Backward(t.deferred) {
		if done[d.name] {
			continue
		}
		done[d.name] = true
		// A later entry may have removed the directory or replaced it or
		// a parent with something else; never chmod through it.
		if !t.policy.ParentsIntact(t, d.name) {
			continue
		}
		if fi, err := t.Root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		f, err := t.Root.OpenFile(d.name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		err = f.Chmod(d.mode)
		if err == nil {
			err = futimens(int(f.Fd()), d.atime, d.mtime)
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
