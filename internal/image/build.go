package image

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/clade-sandbox/clade/internal/tarx"
)

// InstallTar makes a root filesystem from the tar archive r (a sandbox's
// whole tree, from `clade image build`) and returns img describing it. The
// archive is hostile input like any other: tarx refuses escapes, devices
// and writes through symlinks.
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
	return s.commit(b, img)
}
