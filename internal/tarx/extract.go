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
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Extract extracts the tar stream r into the existing directory root.
//
// Nothing is ever written outside root. These entries are refused with an
// InvalidArgument error: absolute names; names whose ".." escapes root; names
// or link targets longer than 4096 bytes; entries whose parent path passes
// through a symlink, whether it was already in root or came earlier in the
// stream; hardlinks whose target escapes or passes through a symlink; device
// and fifo nodes; sparse files; entries larger than MaxEntrySize. Entries
// before a refused one stay extracted. Symlink targets are data and may point
// anywhere.
//
// An existing entry is replaced, never written through: a file over a symlink
// or a hardlink replaces the link, not what it points to. Only a directory
// entry over an existing directory keeps it. Permission bits and mtimes come
// from the headers (set-id bits only with effective Chown). A missing root is
// a NotFound error.
func Extract(root string, r io.Reader, opts Options) error {
	return extract(root, r, opts, nil)
}

// ExtractTo extracts r with `docker cp` semantics for the destination dest.
// If dest is an existing directory, the archive is extracted into it.
// Otherwise every entry must share one top-level name, which is renamed to
// filepath.Base(dest) and extracted into filepath.Dir(dest); a second
// top-level name is an InvalidArgument error, found only once the entries
// before it are extracted. A missing parent directory is a NotFound error.
// Extraction is as safe as Extract's, with filepath.Dir(dest) as the root.
func ExtractTo(dest string, r io.Reader, opts Options) error {
	if dest == "" {
		return errdefs.New(errdefs.InvalidArgument, "empty destination path")
	}
	dest = filepath.Clean(dest)
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		return Extract(dest, r, opts)
	}
	parent, base := filepath.Dir(dest), filepath.Base(dest)
	switch fi, err := os.Stat(parent); {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.New(errdefs.NotFound, "parent directory %s does not exist", parent)
	case err != nil:
		return err
	case !fi.IsDir():
		return errdefs.New(errdefs.InvalidArgument, "parent %s is not a directory", parent)
	}

	var top string
	rename := func(name string) (string, error) {
		first, rest, _ := strings.Cut(name, "/")
		if top == "" {
			top = first
		} else if first != top {
			return "", errdefs.New(errdefs.InvalidArgument,
				"archive has more than one top-level name (%.256q, %.256q): copy into an existing directory instead of %s",
				top, first, dest)
		}
		return path.Join(base, rest), nil
	}
	if err := extract(parent, r, opts, rename); err != nil {
		return err
	}
	if top == "" {
		return errdefs.New(errdefs.InvalidArgument, "archive is empty: nothing to copy to %s", dest)
	}
	return nil
}

type extractor struct {
	root  *os.Root
	chown bool
	// rename maps a clean name inside the archive to one inside root.
	rename func(string) (string, error)
	// dirs caches paths already seen to be real directories, so parents
	// need not Lstat every component of every entry. clear evicts a
	// directory it removes.
	dirs map[string]bool
	// deferred directory metadata is applied once the stream is done, so
	// filling a directory neither needs its write permission nor bumps its
	// mtime afterwards.
	deferred []dirMeta
}

type dirMeta struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

func extract(dir string, r io.Reader, opts Options, rename func(string) (string, error)) error {
	// os.Root resolves every path component by component with O_NOFOLLOW
	// (openat), so even a concurrent attacker swapping directories for
	// symlinks cannot make an operation land outside dir. The Lstat checks
	// in parents add the stricter, deterministic refusal of symlinks.
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.NotFound, err)
	}
	if err != nil {
		return err
	}
	defer root.Close()

	x := &extractor{
		root:   root,
		chown:  opts.Chown && os.Geteuid() == 0,
		rename: rename,
		dirs:   map[string]bool{},
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", streamErr(err))
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("tar entry %.256q: %w", hdr.Name, err)
		}
	}
	return x.finish()
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.InvalidArgument, format, args...)
}

// streamErr classifies a read error: a malformed or truncated archive is the
// sender's fault, a broken connection is not.
func streamErr(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.Wrap(errdefs.InvalidArgument, err)
	}
	return err
}

// CheckHeader validates what a tar header says before anything touches the
// disk, for every extractor of hostile archives: only directories, regular
// files, symlinks and hardlinks; no sparse entries; sizes and link targets
// bounded. skip is true for headers that carry nothing to extract. Errors
// are InvalidArgument.
func CheckHeader(hdr *tar.Header) (skip bool, err error) {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return true, nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return false, invalid("device and fifo nodes are not allowed")
	default:
		return false, invalid("unsupported entry type %q", hdr.Typeflag)
	}
	if sparse(hdr) {
		// The reader expands holes into zeros, so a few header bytes
		// could make us write MaxEntrySize bytes, per entry.
		return false, invalid("sparse files are not supported: recreate the archive without --sparse")
	}
	if hdr.Size > MaxEntrySize {
		return false, invalid("size %d exceeds the limit of %d bytes", hdr.Size, MaxEntrySize)
	}
	if len(hdr.Linkname) > maxNameLen || strings.IndexByte(hdr.Linkname, 0) >= 0 ||
		hdr.Typeflag == tar.TypeSymlink && hdr.Linkname == "" {
		return false, invalid("bad link target %.64q", hdr.Linkname)
	}
	return false, nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	if skip, err := CheckHeader(hdr); skip || err != nil {
		return err
	}
	name, err := x.clean(hdr.Name)
	if err != nil {
		return err
	}
	var target string
	if hdr.Typeflag == tar.TypeLink {
		if target, err = x.clean(hdr.Linkname); err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
	}
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil // root itself: its metadata is the caller's
		}
		return invalid("only a directory can stand for the destination itself")
	}
	if err := x.parents(name, true); err != nil {
		return err
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, name)
	case tar.TypeSymlink:
		return x.symlink(hdr, name)
	case tar.TypeLink:
		return x.link(name, target)
	default:
		return x.file(hdr, name, r)
	}
}

// sparse reports whether hdr is a GNU sparse file, old style or PAX.
func sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// clean validates a header name or hardlink target and returns it as a clean
// slash path relative to root, "." for root itself.
func (x *extractor) clean(name string) (string, error) {
	switch {
	case len(name) > maxNameLen:
		return "", invalid("name longer than %d bytes", maxNameLen)
	case name == "":
		return "", invalid("empty name")
	case path.IsAbs(name):
		return "", invalid("absolute path")
	}
	name = path.Clean(name)
	if name == ".." || strings.HasPrefix(name, "../") {
		return "", invalid("path escapes the destination")
	}
	if x.rename != nil {
		return x.rename(name)
	}
	return name, nil
}

// parents checks that every parent of name is a real directory, creating
// missing ones if create is set. A symlink is refused even if it points
// inside root: Extract promises never to write through one, and a link
// created earlier in the stream would otherwise redirect later entries.
func (x *extractor) parents(name string, create bool) error {
	for i := range len(name) {
		if name[i] != '/' {
			continue
		}
		dir := name[:i]
		if x.dirs[dir] {
			continue
		}
		fi, err := x.root.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := x.root.Mkdir(dir, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return invalid("parent %.256q is a symlink", dir)
		case !fi.IsDir():
			return invalid("parent %.256q is not a directory", dir)
		}
		x.dirs[dir] = true
	}
	return nil
}

// clear makes way for a new entry at name. Anything there is removed rather
// than written through, so an existing symlink or hardlink cannot redirect
// the write. Only a directory entry keeps an existing directory (keep).
func (x *extractor) clear(name string, dir bool) (keep bool, err error) {
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case !fi.IsDir():
		return false, x.root.Remove(name)
	case dir:
		return true, nil
	}
	for d := range x.dirs {
		if d == name || strings.HasPrefix(d, name+"/") {
			delete(x.dirs, d)
		}
	}
	return false, x.root.RemoveAll(name)
}

func (x *extractor) dir(hdr *tar.Header, name string) error {
	keep, err := x.clear(name, true)
	if err != nil {
		return err
	}
	if !keep {
		// Owner-only until finish applies the header's mode.
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return err
		}
	}
	if x.chown {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.dirs[name] = true
	x.deferred = append(x.deferred, dirMeta{name, x.mode(hdr), hdr.AccessTime, hdr.ModTime})
	return nil
}

func (x *extractor) file(hdr *tar.Header, name string, r io.Reader) error {
	if _, err := x.clear(name, false); err != nil {
		return err
	}
	// O_EXCL because os.Root follows a final symlink without it (despite
	// O_NOFOLLOW): if something reappeared since clear, fail rather than
	// write through it.
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL | os.O_TRUNC | syscall.O_NOFOLLOW
	f, err := x.root.OpenFile(name, flags, 0o600)
	if err != nil {
		return err
	}
	if _, err = io.Copy(f, r); err != nil {
		err = streamErr(err)
	}
	if err == nil && x.chown {
		err = f.Chown(hdr.Uid, hdr.Gid) // before Chmod: chown clears set-id bits
	}
	if err == nil {
		err = f.Chmod(x.mode(hdr))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return x.chtimes(name, hdr.AccessTime, hdr.ModTime)
}

func (x *extractor) symlink(hdr *tar.Header, name string) error {
	if _, err := x.clear(name, false); err != nil {
		return err
	}
	if err := x.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	if x.chown {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	return x.chtimes(name, hdr.AccessTime, hdr.ModTime)
}

func (x *extractor) link(name, target string) error {
	if target == name {
		return nil // clearing name first would lose the file
	}
	err := x.parents(target, false)
	var fi fs.FileInfo
	if err == nil {
		fi, err = x.root.Lstat(target)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return invalid("hardlink target %.256q does not exist", target)
	case err != nil:
		return fmt.Errorf("hardlink target: %w", err)
	case fi.IsDir():
		return invalid("hardlink target %.256q is a directory", target)
	}
	if _, err := x.clear(name, false); err != nil {
		return err
	}
	// A target that is itself a symlink is linked, not followed.
	return x.root.Link(target, name)
}

func (x *extractor) mode(hdr *tar.Header) fs.FileMode {
	m := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if !x.chown {
		// A set-id file owned by the caller would hand the caller's
		// privileges to whoever wrote the archive.
		m &^= fs.ModeSetuid | fs.ModeSetgid
	}
	return m
}

// chtimes sets name's times without following it if it is a symlink, which
// os.Root has no method for. A zero time is left unchanged.
func (x *extractor) chtimes(name string, atime, mtime time.Time) error {
	d, err := x.root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer d.Close()
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(int(d.Fd()), path.Base(name), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
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
func (x *extractor) finish() error {
	done := map[string]bool{}
	for _, d := range slices.Backward(x.deferred) {
		if done[d.name] {
			continue
		}
		done[d.name] = true
		// A later entry may have replaced the directory or a parent with
		// something else; never chmod through it.
		if x.parents(d.name, false) != nil {
			continue
		}
		if fi, err := x.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		if err := x.root.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if err := x.chtimes(d.name, d.atime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}
