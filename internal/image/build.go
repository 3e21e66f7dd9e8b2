package image

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/clade-sandbox/clade/internal/tarx"
)

// InstallTar makes an image called img.Name whose root filesystem is the tar
// archive r (a sandbox's whole tree, from `clade image build`). The archive
// is hostile input like any other: tarx refuses escapes, devices and writes
// through symlinks. An existing image of that name is replaced atomically;
// its root lives on while sandboxes use it.
func (s *Store) InstallTar(ctx context.Context, img Image, r io.Reader) (Image, error) {
	if err := checkNewName(img.Name); err != nil {
		return Image{}, err
	}
	b, err := s.begin(img.Name)
	if err != nil {
		return Image{}, err
	}
	defer b.close()
	rootfs := filepath.Join(b.dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, err
	}
	if err := tarx.Extract(rootfs, r, tarx.Options{Chown: true}); err != nil {
		return Image{}, err
	}
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	img.CreatedAt = time.Now().UTC()
	img.SizeBytes = DirSize(rootfs)
	if _, err := s.commit(b, img); err != nil {
		return Image{}, err
	}
	img, err = s.Get(ctx, img.Name)
	if err != nil {
		return Image{}, err
	}
	return img, nil
}

// SetSnapshot records (or, with "", clears) a template's ready snapshot.
func (s *Store) SetSnapshot(ctx context.Context, name, snapshot string) (Image, error) {
	img, err := s.Get(ctx, name)
	if err != nil {
		return Image{}, err
	}
	img.Snapshot = snapshot
	return img, s.writeMeta(img)
}

// writeMeta rewrites an image's image.json atomically.
func (s *Store) writeMeta(img Image) error {
	j, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, img.Name, "image.json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, j, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
