package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// A volume's bytes live in one ext4 image file, loop-mounted on the host
// while a sandbox uses it and bind-mounted into the sandbox by the engine.
// Measured on this host (ext4 data dir, no XFS project quotas, no
// dm-crypt): a loop-mounted image is the one size limit that holds for
// every writer (ENOSPC inside the sandbox, the host's other files
// untouched), and a clone of a volume is a copy of one file: a reflink
// (FICLONE) on btrfs/XFS, a copy of its allocated extents elsewhere.

// format makes a sparse ext4 image of size bytes at path.
func format(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.Join(err, os.Remove(path))
	}
	// No reserved blocks: the whole size is the user's. Lazy init keeps a
	// 10 GiB image sparse and its creation fast.
	cmd := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Join(fmt.Errorf("mkfs.ext4 %s: %w: %s", path, err, strings.TrimSpace(string(out))), os.Remove(path))
	}
	// After mkfs, which punches holes into a regular file it discards.
	if err := reserve(path); err != nil {
		return errors.Join(err, os.Remove(path))
	}
	return nil
}

// reserve allocates the holes of the image at path, so every block the
// volume's file system may write is the image's already. A sparse image
// would take host disk as it is written: with the host's disk full (other
// volumes, snapshots), the loop device's write fails, ext4 inside aborts its
// journal and writes the sandbox saw succeed (fsync included) are lost.
// The holes become unwritten extents: they cost no write, read as zeros and
// a copy (SEEK_DATA) still skips them. ResourceExhausted when the host has
// no room; on a file system that shares extents (a reflink clone) the shared
// ones are not reserved. On FUSE (the gocryptfs view of --encrypt-at-rest)
// the image stays sparse: a preallocated image there reads as data, so every
// later copy of it (snapshot, fork child) would copy its whole size through
// FUSE (measured: a 1 GiB volume's snapshot 12 s instead of 0.7 s).
func reserve(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err == nil && sfs.Type == fuseSuperMagic {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, fi.Size())
	if errors.Is(err, unix.ENOSPC) {
		return errdefs.New(errdefs.ResourceExhausted, "the host's disk has no room to reserve %d MiB for a volume: free disk or pick a smaller --size", fi.Size()>>20)
	}
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil // no fallocate here (e.g. some FUSE file systems): stays sparse
	}
	if err != nil {
		return fmt.Errorf("reserve %s: %w", path, err)
	}
	return nil
}

// mountImage attaches img to a free loop device (freed by the kernel when
// the file system is unmounted) and mounts it at target.
func mountImage(img, target string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o700); err != nil {
		return err
	}
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(img, flags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("loop devices are not available (modprobe loop): %w", err)
	}
	defer ctl.Close()
	// Another process may take the free device between GET_FREE and
	// CONFIGURE: take the next one then.
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lf, err := os.OpenFile(dev, flags, 0)
		if err != nil {
			return err
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if readOnly {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		copy(cfg.Info.File_name[:], filepath.Base(img))
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && try < 20 {
			lf.Close()
			continue
		}
		if err != nil {
			lf.Close()
			return fmt.Errorf("attach %s to %s: %w", img, dev, err)
		}
		var mflags uintptr = unix.MS_NOSUID | unix.MS_NODEV
		if readOnly {
			mflags |= unix.MS_RDONLY
		}
		err = unix.Mount(dev, target, "ext4", mflags, "")
		// Closing our descriptor lets AUTOCLEAR free the device once the
		// file system lets go of it (or now, if the mount failed).
		lf.Close()
		if err != nil {
			return fmt.Errorf("mount %s on %s: %w", img, target, err)
		}
		return nil
	}
}

// unmount unmounts target if it is a mount point; the loop device goes
// with it. A target that is not mounted (or gone) is not an error.
func unmount(target string) error {
	// An unmount of a frozen file system can hang on its final sync: a
	// daemon killed mid-copy leaves the freeze behind.
	thaw(target)
	for try := 0; ; try++ {
		err := unix.Unmount(target, 0)
		switch {
		case err == nil:
			continue // stacked mounts (a retried mount): take them all off
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && try < 50:
			// A gofer that is exiting still holds it for a moment.
			time.Sleep(20 * time.Millisecond)
			continue
		case errors.Is(err, unix.EBUSY):
			// Detach it: the loop device is freed when the last user goes.
			return unix.Unmount(target, unix.MNT_DETACH)
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
}

// thaw undoes a freeze of the file system mounted at target, if any
// (FITHAW of a file system that is not frozen is EINVAL: nothing to do).
func thaw(target string) {
	if !mounted(target) {
		return
	}
	f, err := os.Open(target)
	if err != nil {
		return
	}
	defer f.Close()
	_ = unix.IoctlSetInt(int(f.Fd()), fiThaw, 0)
}

// mounted reports whether target is a mount point.
func mounted(target string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(target, &st) != nil || unix.Lstat(filepath.Dir(target), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// fuseSuperMagic is a FUSE file system's statfs type (linux/magic.h).
const fuseSuperMagic = 0x65735546

// syncFS flushes the file system mounted at dir to its image.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// Clone methods, as inspect reports them.
const (
	CloneReflink = "reflink"
	CloneCopy    = "copy"
)

// cloneFile makes dst a copy of src: a reflink where the file system
// shares extents (O(1) in the size), otherwise a copy of src's allocated
// extents only (holes stay holes). It returns the method used. On error
// dst does not exist.
func cloneFile(src, dst string) (method string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return CloneReflink, nil
	}
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return "", err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return "", err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return "", err
		}
		if err := copyRange(in, out, data, hole-data); err != nil {
			return "", err
		}
		off = hole
	}
	return CloneCopy, out.Sync()
}

// copyRange copies n bytes at off from in to out, at the same offset.
func copyRange(in, out *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			// Fall back to read/write (e.g. across file systems on old kernels).
			_, err = io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
			return err
		}
		if c == 0 {
			return fmt.Errorf("copy %s: short copy at %d", in.Name(), off)
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}
