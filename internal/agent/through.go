package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// maxThroughFiles bounds the files of one write-through upload (E2B's
// front sends one per request).
const maxThroughFiles = 1024

// maxLinkHops bounds the symlinks followed to a missing target (Linux's
// own bound, MAXSYMLINKS).
const maxLinkHops = 40

// writeThrough is an OpTarPut with Through (wire.Request): the regular
// files of the archive r written into the directory dir as a program of
// user writes them (E2B's envd semantics). It runs on a thread of its own
// that takes user's credentials (a non-root user's uid, gid and groups,
// for this thread only) and ends with it, so that the kernel checks every
// open, create and rename as the user's: a symlink the user made can lead
// the write only where the user may write anyway.
func writeThrough(accounts, dir, user string, r io.Reader) error {
	var u *account
	if user != "" {
		var err error
		if u, err = resolveUser(accounts, user); err != nil {
			return err
		}
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: a thread whose credentials changed exits with
		// this goroutine instead of running others.
		runtime.LockOSThread()
		if u != nil && (u.UID != 0 || u.GID != 0) {
			if err := threadCredentials(u); err != nil {
				errc <- fmt.Errorf("take the credentials of user %s: %w", user, err)
				return
			}
		}
		errc <- writeFiles(dir, r, user)
	}()
	return <-errc
}

// threadCredentials gives the calling thread (alone: the raw system calls,
// not Go's, which apply to every thread of the process) u's groups, gid and
// uid, in that order (once the uid is dropped the others cannot change).
func threadCredentials(u *account) error {
	groups := slices.Clone(u.Groups)
	var p uintptr
	if len(groups) > 0 {
		p = uintptr(unsafe.Pointer(&groups[0]))
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), p, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(u.GID), uintptr(u.GID), uintptr(u.GID)); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(u.UID), uintptr(u.UID), uintptr(u.UID)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return nil
}

// writeFiles writes the regular files of r into dir (see writeThrough).
func writeFiles(dir string, r io.Reader, user string) error {
	if fi, err := os.Stat(dir); err != nil {
		return fileErr(err, dir, user)
	} else if !fi.IsDir() {
		return errdefs.New(errdefs.InvalidArgument, "%s is not a directory", dir)
	}
	tr := tar.NewReader(r)
	for n := 1; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("read the archive: %w", err))
		}
		if n > maxThroughFiles {
			return errdefs.New(errdefs.InvalidArgument, "more than %d files in one write", maxThroughFiles)
		}
		if skip, err := tarx.CheckHeader(hdr); err != nil {
			return err
		} else if skip {
			continue
		}
		name := hdr.Name
		if hdr.Typeflag != tar.TypeReg || name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
			return errdefs.New(errdefs.InvalidArgument, "entry %.256q: a write takes regular files named by one path component", name)
		}
		if err := writeOne(filepath.Join(dir, name), hdr, tr, user); err != nil {
			return err
		}
	}
}

// writeOne writes the file p through what is there, in place, as envd
// does (so a watch sees it written): the target of a symlink at p
// (followed as open(2) follows it, a missing target made), truncated and
// written, keeping its owner and permission bits; a directory is refused
// by the open itself, and anything but a regular file (a FIFO, a device)
// before it is touched. A write that fails removes the file, as a failed
// upload always did here: no partial file is left.
func writeOne(p string, hdr *tar.Header, r io.Reader, user string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, uint32(fs.FileMode(hdr.Mode).Perm()))
	if err != nil {
		if errors.Is(err, syscall.EISDIR) {
			return errdefs.New(errdefs.InvalidArgument, "%s is a directory", p)
		}
		return fileErr(&fs.PathError{Op: "open", Path: p, Err: err}, p, user)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileErr(err, p, user)
	}
	if !fi.Mode().IsRegular() {
		return errdefs.New(errdefs.InvalidArgument, "%s is not a regular file", p)
	}
	err = f.Truncate(0)
	if err == nil {
		// New content: the user.* attributes that described the old
		// (E2B's file metadata) go, as they would with a new file.
		err = dropUserXattrs(fd)
	}
	if err == nil {
		_, err = io.CopyN(f, r, hdr.Size)
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		if target, lerr := followLinks(p); lerr == nil {
			os.Remove(target)
		}
		return fileErr(err, p, user)
	}
	return nil
}

// dropUserXattrs removes the user.* extended attributes of the open file
// fd; a file system without them has none to remove.
func dropUserXattrs(fd int) error {
	buf := make([]byte, 64<<10)
	n, err := unix.Flistxattr(fd, buf)
	if err != nil {
		if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ERANGE) {
			return nil
		}
		return err
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(name, "user.") {
			if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	return nil
}

// followLinks returns where a write to p lands: p's symlinks followed
// (each relative target from its link's directory), the last one's target
// even when it does not exist yet.
func followLinks(p string) (string, error) {
	for range maxLinkHops {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil
		}
		dest, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(p), dest)
		}
		p = filepath.Clean(dest)
	}
	return "", &fs.PathError{Op: "open", Path: p, Err: syscall.ELOOP}
}

// fileErr classifies a file error of a write as user: what the user may
// not write, or what cannot be written at all (/proc), is the request's
// fault, not the agent's.
func fileErr(err error, p, user string) error {
	if user == "" {
		user = "root"
	}
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("write %s: %w", p, err))
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.New(errdefs.NotFound, "write %s: %v", p, err)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return errdefs.New(errdefs.InvalidArgument, "write %s: permission denied: user %s may not write there (%v)", p, user, err)
	case errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EXDEV):
		return errdefs.New(errdefs.InvalidArgument, "write %s: %v", p, err)
	}
	return fmt.Errorf("write %s: %w", p, err)
}
