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
	"strings"
	"syscall"

	"github.com/klauspost/compress/zstd"

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
	return tarx.Walk(root, r, tarx.WalkOptions{Chown: true, Xattrs: true, What: "layer entry", StreamErr: streamErr},
		&layerPolicy{resolved: map[string]string{}, added: map[string]bool{}})
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

// layerPolicy places a layer's entries as the sandbox will see them:
// symlinks met as parents are followed inside the root, and whiteouts hide
// what lower layers put there.
type layerPolicy struct {
	// resolved caches parent directories already resolved (key: the path
	// as named, value: the real path in root). Removing a directory or
	// symlink drops the whole cache.
	resolved map[string]string
	// added holds the real paths this layer created: whiteouts only hide
	// what lower layers put there.
	added map[string]bool
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

func (a *layerPolicy) Place(t *tarx.Tree, hdr *tar.Header) (string, bool, error) {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return "", false, err
	}
	if name == "." {
		return "", true, nil // the root's metadata is the store's
	}
	dir, base := path.Split(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return "", true, a.whiteout(t, dir, base)
	}
	dir, err = a.resolve(t, dir, true)
	if err != nil {
		return "", false, err
	}
	return path.Join(dir, base), false, nil
}

func (a *layerPolicy) LinkTarget(t *tarx.Tree, hdr *tar.Header) (string, error) {
	name, err := cleanName(hdr.Linkname)
	if err != nil {
		return "", fmt.Errorf("hardlink target: %w", err)
	}
	dir, base := path.Split(name)
	dir, err = a.resolve(t, dir, false)
	return path.Join(dir, base), err
}

func (a *layerPolicy) ParentsIntact(t *tarx.Tree, p string) bool {
	r, err := a.resolve(t, path.Dir(p), false)
	return err == nil && r == path.Dir(p)
}

func (a *layerPolicy) Removed(string) { clear(a.resolved) } // a cached path may run through it

// Wrote marks p and its parents as this layer's: a whiteout in it must not
// hide them, and an opaque directory above them keeps them.
func (a *layerPolicy) Wrote(p string) {
	for q := p; q != "." && !a.added[q]; q = path.Dir(q) {
		a.added[q] = true
	}
}

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
func (a *layerPolicy) resolve(t *tarx.Tree, dir string, create bool) (string, error) {
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
		fi, err := t.Root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := t.Root.Mkdir(next, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", invalid("too many levels of symlinks in %.256q", dir)
			}
			target, err := t.Root.Readlink(next)
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
func (a *layerPolicy) whiteout(t *tarx.Tree, dir, base string) error {
	if strings.HasPrefix(base, whiteoutMeta) && base != whiteoutOpaque {
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if base != whiteoutOpaque && (target == "" || target == "." || target == "..") {
		return invalid("bad whiteout")
	}
	d, err := a.resolve(t, dir, false)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	if base == whiteoutOpaque {
		return a.opaque(t, d)
	}
	p := path.Join(d, target)
	if a.added[p] {
		return nil
	}
	return t.Remove(p)
}

// opaque removes everything under dir that this layer did not add.
func (a *layerPolicy) opaque(t *tarx.Tree, dir string) error {
	f, err := t.Root.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
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
			err = t.Remove(p)
		case e.IsDir():
			err = a.opaque(t, p)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
