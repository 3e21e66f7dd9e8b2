// Package image makes the root filesystems sandboxes boot from: it pulls,
// imports and installs them into a directory (the image directory) and
// returns an Image describing each. What images a daemon has, by name and
// reference, is the daemon's store's business, not this package's: the image
// directory holds content only (roots under .roots/, layer blobs), so
// daemons with different data dirs may share it. The one exception is the
// default image, built offline once per image directory: it and images made
// by versions before the store kept image metadata are directories
// <name>/ holding image.json (a descriptor) and, for the oldest, rootfs/;
// Descriptors lists them for the daemon to adopt.
//
// Images are never written by sandboxes (each sandbox writes to its own
// overlay upper layer), so any number of sandboxes share one.
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Default is the name of the image built offline from Debian's packages.
const Default = "default"

// Image describes one image.
type Image struct {
	Name string `json:"name"`
	// Ref is the normalized reference (see NormalizeRef) the image was
	// pulled or imported as; "" if none.
	Ref       string    `json:"ref,omitempty"`
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	// RootFS is the directory of the image's root filesystem.
	RootFS string `json:"-"`
	// Root is the id of the image's root filesystem under .roots/, in a
	// descriptor; images built before roots were versioned keep theirs in
	// <name>/rootfs.
	Root string `json:"root,omitempty"`

	// Set for images pulled or imported from OCI and Docker images; Source
	// is then the reference or file they came from.
	Platform       string   `json:"platform,omitempty"`
	ManifestDigest string   `json:"manifest_digest,omitempty"`
	ConfigDigest   string   `json:"config_digest,omitempty"`
	Layers         []string `json:"layers,omitempty"` // blob digests, base first
	Config         Config   `json:"config,omitzero"`
	// Snapshot, for a template, is the ready snapshot that creates restore
	// instead of booting: its start command already running.
	Snapshot string `json:"snapshot,omitempty"`
}

// Store is an image directory.
type Store struct {
	dir string
	log *slog.Logger
	// Mirror is the Debian mirror the default image is built from.
	Mirror string
	// OnRoot, if set, is called with the path of a new root filesystem
	// before it is moved there, so that the caller can record it and
	// collect it should the install never finish; an error abandons the
	// install.
	OnRoot func(rootfs string) error
}

// NewStore opens the image directory dir, creating it if needed, and
// removes what interrupted pulls, imports and removals left there.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{dir: dir, log: log, Mirror: "http://deb.debian.org/debian"}
	s.cleanup()
	return s, nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidName reports whether name can name an image.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Dir returns the image directory.
func (s *Store) Dir() string { return s.dir }

// descriptor reads the descriptor <dir>/<name>/image.json; fs.ErrNotExist
// if there is none.
func (s *Store) descriptor(name string) (Image, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, name, "image.json"))
	if err != nil {
		return Image{}, err
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	img.Name = name
	img.RootFS = filepath.Join(s.dir, name, "rootfs")
	if img.Root != "" {
		img.RootFS = filepath.Join(s.dir, rootsDir, img.Root)
	}
	return img, nil
}

// Descriptors returns the images described by <name>/image.json files: the
// default image and those written by versions before image metadata moved
// into the daemon's store. A descriptor that cannot be read is skipped and
// logged.
func (s *Store) Descriptors(ctx context.Context) ([]Image, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, d := range ents {
		if !d.IsDir() || !ValidName(d.Name()) || d.Name() == blobsDir {
			continue
		}
		img, err := s.descriptor(d.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			s.log.Warn("unreadable image descriptor", "image", d.Name(), "err", err)
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Descriptor returns the image the descriptor <name>/image.json describes;
// NotFound if there is none.
func (s *Store) Descriptor(ctx context.Context, name string) (Image, error) {
	if !ValidName(name) || name == blobsDir {
		return Image{}, errdefs.New(errdefs.InvalidArgument, "bad image name %q", name)
	}
	img, err := s.descriptor(name)
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, errdefs.New(errdefs.NotFound, "no image descriptor %q", name)
	}
	return img, err
}

// RemoveDescriptor removes the descriptor <name>/image.json, so the image
// is not adopted again, and unless keepRoot the directory with it (and the
// root inside it, for the oldest images). A missing one is not an error.
func (s *Store) RemoveDescriptor(ctx context.Context, name string, keepRoot bool) error {
	if !ValidName(name) || name == blobsDir {
		return errdefs.New(errdefs.InvalidArgument, "bad image name %q", name)
	}
	meta := filepath.Join(s.dir, name, "image.json")
	if _, err := os.Lstat(meta); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if keepRoot {
		return os.Remove(meta)
	}
	// Rename first, so the image disappears at once and a crash midway
	// leaves only a directory cleanup removes.
	trash := filepath.Join(s.dir, rmPrefix+name+"-"+randHex())
	if err := os.Rename(filepath.Join(s.dir, name), trash); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	return nil
}

// EnsureDefault builds the default image if it is missing (see
// EnsureBuiltin).
func (s *Store) EnsureDefault(ctx context.Context) error {
	return s.EnsureBuiltin(ctx, Default)
}

// DirSize adds up the sizes of the regular files under root.
func DirSize(root string) int64 {
	var n int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
