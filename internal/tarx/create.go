package tarx

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Create writes a tar archive of src to w with entry names rooted at name:
// name "data" gives "data", "data/a.txt", and so on. name is cleaned as if it
// were rooted, so entries never start with "/" or "..".
//
// src is Lstat'ed, never followed: a symlink is stored as a link, and so is
// every symlink inside a directory. Directories are walked recursively.
// Devices, fifos and sockets inside a directory are skipped, since Extract
// would refuse them; src itself being one is an InvalidArgument error.
// A missing src is a NotFound error.
func Create(w io.Writer, src, name string) error {
	return CreateFiltered(w, src, name, nil)
}

// CreateFiltered is Create that leaves out the paths (relative to src, with
// forward slashes) for which skip returns true, and what is below them.
func CreateFiltered(w io.Writer, src, name string, skip func(rel string) bool) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.NotFound, fmt.Errorf("%s: no such file or directory", src))
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
		return errdefs.New(errdefs.InvalidArgument, "%s: not a regular file, directory or symlink", src)
	}
	name = strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(name)), "/")
	if name == "" {
		name = "."
	}

	tw := tar.NewWriter(w)
	if fi.IsDir() {
		err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			if skip != nil && rel != "." && skip(filepath.ToSlash(rel)) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			return add(tw, p, path.Join(name, filepath.ToSlash(rel)), fi)
		})
	} else {
		err = add(tw, src, name, fi)
	}
	if err != nil {
		return err
	}
	return tw.Close()
}

// add writes one entry for the file at p, described by its Lstat info fi.
func add(tw *tar.Writer, p, name string, fi fs.FileInfo) error {
	var link string
	var f *os.File
	switch mode := fi.Mode(); {
	case mode.IsRegular():
		// O_NOFOLLOW and a fresh Stat of the open file keep the header true
		// to the bytes read even if p was swapped since the walk saw it.
		// Opened by hand: os.OpenFile tries the poller on a regular file
		// (four fcntls and an epoll_ctl, each a trap under gVisor).
		// O_NONBLOCK: p swapped for a FIFO would block the open until a
		// writer came, maybe never; the Stat below then skips it. Cleared
		// right away, so os.NewFile does not try the poller.
		var fd int
		err := ignoringEINTR(func() (err error) {
			fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			return err
		})
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil {
			unix.Close(fd)
			return &fs.PathError{Op: "fcntl", Path: p, Err: err}
		}
		f = os.NewFile(uintptr(fd), p)
		defer f.Close()
		if fi, err = f.Stat(); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
	case mode&fs.ModeSymlink != 0:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case !mode.IsDir():
		return nil
	}

	hdr, err := tar.FileInfoHeader(noNames{fi}, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if f != nil {
		// CopyN: a file that grew since Stat is cut to the header's size
		// rather than corrupting the stream; one that shrank is an error.
		bp := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(bp)
		// In reads of copyBufSize (io.CopyN reads 32 KiB at a time: under
		// gVisor each read is a trap into the sentry).
		n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), *bp)
		if err == nil && n < hdr.Size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return fmt.Errorf("archive %s: %w", p, err)
		}
	}
	return nil
}

// noNames stops tar.FileInfoHeader from looking up user and group names:
// extraction only uses the numeric ids.
type noNames struct{ fs.FileInfo }

func (noNames) Uname() (string, error) { return "", nil }
func (noNames) Gname() (string, error) { return "", nil }
