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
// If dest is an existing directory, the archive is extracted into it, with
// every entry under opts.Top if that is set. Otherwise every entry must
// share one top-level name, which is renamed to filepath.Base(dest) and
// extracted into filepath.Dir(dest); a second top-level name is an
// InvalidArgument error, found only once the entries before it are
// extracted. A missing parent directory is a NotFound error. Extraction is
// as safe as Extract's, with filepath.Dir(dest) as the root.
//
// dest's parents are the caller's and are followed; dest itself is not,
// unless opts.FollowDest is set: a symlink at dest is replaced like any
// other non-directory, so whatever a copy made at dest, repeating the copy
// writes only there again. A dest ending in a slash asks for the
// directory it names, a symlink to one included: it must exist (NotFound)
// and be a directory (InvalidArgument), so that form never makes dest
// either.
func ExtractTo(dest string, r io.Reader, opts Options) error {
	if dest == "" {
		return errdefs.New(errdefs.InvalidArgument, "empty destination path")
	}
	slash := strings.HasSuffix(dest, "/") && !opts.FollowDest
	dest = filepath.Clean(dest)
	stat := os.Lstat
	if slash || opts.FollowDest {
		stat = os.Stat
	}
	fi, err := stat(dest)
	switch {
	case err == nil && fi.IsDir():
		return extract(dest, r, opts, under(opts.Top))
	case slash && errors.Is(err, fs.ErrNotExist):
		return errdefs.New(errdefs.NotFound, "directory %s does not exist: create it first, or leave out the trailing slash to copy as %s", dest, dest)
	case slash && err == nil:
		return errdefs.New(errdefs.InvalidArgument, "%s is not a directory: leave out the trailing slash to replace it", dest)
	case slash:
		return err
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

// copyPolicy places a copy's entries: names relative to the destination,
// never through a symlink (even one pointing inside), renamed by rename.
type copyPolicy struct {
	// rename maps a clean name inside the archive to one inside root.
	rename func(string) (string, error)
	// dirs caches paths already seen to be real directories, so parents
	// need not Lstat every component of every entry. Removed evicts a
	// directory that goes.
	dirs map[string]bool
}

// under returns a rename that refuses names outside top ("" allows any).
func under(top string) func(string) (string, error) {
	if top == "" {
		return nil
	}
	return func(name string) (string, error) {
		if first, _, _ := strings.Cut(name, "/"); first != top && name != "." {
			return "", invalid("outside %.256q, the name of what was copied", top)
		}
		return name, nil
	}
}

func extract(dir string, r io.Reader, opts Options, rename func(string) (string, error)) error {
	return Walk(dir, r, WalkOptions{Chown: opts.Chown, Owner: opts.Owner, What: "tar entry", Limit: opts.Limit}, &copyPolicy{rename: rename, dirs: map[string]bool{}})
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

func (x *copyPolicy) Place(t *Tree, hdr *tar.Header) (string, bool, error) {
	name, err := x.clean(hdr.Name)
	if err != nil {
		return "", false, err
	}
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			return "", true, nil // root itself: its metadata is the caller's
		}
		return "", false, invalid("only a directory can stand for the destination itself")
	}
	if hdr.Typeflag == tar.TypeLink {
		// Checked before anything is created for the entry.
		if _, err := x.clean(hdr.Linkname); err != nil {
			return "", false, fmt.Errorf("hardlink target: %w", err)
		}
	}
	return name, false, x.parents(t, name, true)
}

func (x *copyPolicy) LinkTarget(t *Tree, hdr *tar.Header) (string, error) {
	target, err := x.clean(hdr.Linkname)
	if err != nil {
		return "", fmt.Errorf("hardlink target: %w", err)
	}
	return target, x.parents(t, target, false)
}

func (x *copyPolicy) ParentsIntact(t *Tree, p string) bool { return x.parents(t, p, false) == nil }

func (x *copyPolicy) Removed(p string) {
	for d := range x.dirs {
		if d == p || strings.HasPrefix(d, p+"/") {
			delete(x.dirs, d)
		}
	}
}

func (x *copyPolicy) Wrote(p string) {}

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
func (x *copyPolicy) clean(name string) (string, error) {
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
func (x *copyPolicy) parents(t *Tree, name string, create bool) error {
	for i := range len(name) {
		if name[i] != '/' {
			continue
		}
		dir := name[:i]
		if x.dirs[dir] {
			continue
		}
		fi, err := t.Root.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := t.Root.Mkdir(dir, 0o755); err != nil {
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
