package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Image is an image's record. Its root filesystem is a directory in the
// image directory (which daemons with different data dirs may share); the
// record is this daemon's.
type Image struct {
	Name string
	// Ref is the normalized reference the image was pulled or imported as
	// (e.g. "index.docker.io/library/python:3.12-slim"); "" if none.
	Ref    string
	Source string
	// RootFS is the directory of the image's root filesystem.
	RootFS string
	// Snapshot, for a template, is its ready snapshot.
	Snapshot  string
	SizeBytes int64
	// Meta is the image package's description of the image (config,
	// layers, digests), as JSON: the store does not read it.
	Meta      []byte
	CreatedAt time.Time
}

// imageSchema adds the image tables. image_roots lists the root
// filesystems this daemon made: only those may it remove once unused, for
// the image directory may be shared with daemons that use others. A root
// is pending while its image is being installed.
const imageSchema = `
CREATE TABLE IF NOT EXISTS images (
	name       TEXT PRIMARY KEY,
	ref        TEXT NOT NULL DEFAULT '',
	source     TEXT NOT NULL,
	rootfs     TEXT NOT NULL,
	snapshot   TEXT NOT NULL DEFAULT '',
	size_bytes INTEGER NOT NULL DEFAULT 0,
	meta       TEXT NOT NULL DEFAULT '{}',
	created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS images_ref ON images (ref);
CREATE TABLE IF NOT EXISTS image_roots (
	rootfs  TEXT PRIMARY KEY,
	pending INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS build_sandboxes (
	id TEXT PRIMARY KEY
);`

// The image tables are a migration of their own: databases of every
// earlier version lack them, and CREATE ... IF NOT EXISTS is idempotent.
func init() { migrations = append(migrations, imageSchema) }

const imageCols = `name, ref, source, rootfs, snapshot, size_bytes, meta, created_at`

func scanImage(row scanner) (Image, error) {
	var img Image
	var meta string
	var created int64
	if err := row.Scan(&img.Name, &img.Ref, &img.Source, &img.RootFS, &img.Snapshot, &img.SizeBytes, &meta, &created); err != nil {
		return Image{}, err
	}
	img.Meta = []byte(meta)
	img.CreatedAt = time.Unix(0, created).UTC()
	return img, nil
}

// GetImage returns the image called name; NotFound if there is none.
// Records found are cached until the next write to the images table: a
// create reads its image on its path.
func (s *Store) GetImage(ctx context.Context, name string) (Image, error) {
	s.imgMu.Lock()
	img, ok := s.imgCache[name]
	gen := s.imgGen
	s.imgMu.Unlock()
	if ok {
		return cloneImage(img), nil
	}
	img, err := scanImage(s.db.QueryRowContext(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Image{}, errdefs.New(errdefs.NotFound, "no image %q", name)
	}
	if err == nil {
		s.imgMu.Lock()
		if s.imgGen == gen { // no write since the query began
			if s.imgCache == nil {
				s.imgCache = map[string]Image{}
			}
			s.imgCache[name] = cloneImage(img)
		}
		s.imgMu.Unlock()
	}
	return img, err
}

func cloneImage(img Image) Image {
	img.Meta = append([]byte(nil), img.Meta...)
	return img
}

// imagesChanged forgets the cached image records; every write to the
// images table calls it once the write is done.
func (s *Store) imagesChanged() {
	s.imgMu.Lock()
	s.imgGen++
	clear(s.imgCache)
	s.imgMu.Unlock()
}

// GetImageByRef returns the newest image pulled or imported as the
// normalized reference ref; NotFound if there is none.
func (s *Store) GetImageByRef(ctx context.Context, ref string) (Image, error) {
	if ref == "" {
		return Image{}, errdefs.New(errdefs.NotFound, "no image with an empty reference")
	}
	img, err := scanImage(s.db.QueryRowContext(ctx, `SELECT `+imageCols+` FROM images WHERE ref = ? ORDER BY created_at DESC, name LIMIT 1`, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Image{}, errdefs.New(errdefs.NotFound, "no image pulled as %q", ref)
	}
	return img, err
}

// ListImages returns every image, by name.
func (s *Store) ListImages(ctx context.Context) ([]Image, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+imageCols+` FROM images ORDER BY name`)
	return collect(rows, err, scanImage)
}

// PutImage records img, replacing an image of the same name, and returns
// the record it replaced (ok false if none). img's root stops being
// pending; the replaced root stays until CollectImageRoots finds it unused.
func (s *Store) PutImage(ctx context.Context, img Image) (old Image, ok bool, err error) {
	defer s.imagesChanged()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		old, err = scanImage(tx.QueryRowContext(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, img.Name))
		switch {
		case err == nil:
			ok = true
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if img.CreatedAt.IsZero() {
			img.CreatedAt = time.Now()
		}
		meta := string(img.Meta)
		if meta == "" {
			meta = "{}"
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO images (`+imageCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			img.Name, img.Ref, img.Source, img.RootFS, img.Snapshot, img.SizeBytes, meta, img.CreatedAt.UnixNano()); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE image_roots SET pending = 0 WHERE rootfs = ?`, img.RootFS)
		return err
	})
	return old, ok, err
}

// AdoptImage records img unless an image of that name exists, and says
// whether it did. Adopted roots are not this daemon's to remove.
func (s *Store) AdoptImage(ctx context.Context, img Image) (bool, error) {
	defer s.imagesChanged()
	meta := string(img.Meta)
	if meta == "" {
		meta = "{}"
	}
	res, err := s.exec(ctx, `INSERT OR IGNORE INTO images (`+imageCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		img.Name, img.Ref, img.Source, img.RootFS, img.Snapshot, img.SizeBytes, meta, img.CreatedAt.UnixNano())
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// SetImageSnapshot records (or, with "", clears) a template's ready
// snapshot and returns the updated image.
func (s *Store) SetImageSnapshot(ctx context.Context, name, snapshot string) (Image, error) {
	res, err := s.exec(ctx, `UPDATE images SET snapshot = ? WHERE name = ?`, snapshot, name)
	s.imagesChanged()
	if err != nil {
		return Image{}, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Image{}, errdefs.New(errdefs.NotFound, "no image %q", name)
	}
	return s.GetImage(ctx, name)
}

// ImageUsers lists the sandboxes ("sandbox ID") and snapshots ("snapshot
// ID") made from the image called name, its own template snapshot aside.
func (s *Store) ImageUsers(ctx context.Context, name string) ([]string, error) {
	var users []string
	err := s.inTx(ctx, func(tx *sql.Tx) (err error) {
		users, err = imageUsers(ctx, tx, name)
		return err
	})
	return users, err
}

func imageUsers(ctx context.Context, tx *sql.Tx, name string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT 'sandbox ' || id FROM sandboxes WHERE image = ?1
		UNION ALL SELECT 'snapshot ' || id FROM snapshots WHERE image = ?1
			AND id != COALESCE((SELECT snapshot FROM images WHERE name = ?1), '')`, name)
	return collect(rows, err, scanString)
}

// DeleteImage removes the image called name if no sandbox or snapshot was
// made from it (its own template snapshot aside), checking and removing in
// one transaction, and returns the removed record. NotFound if there is
// no such image; Conflict, naming the users, if it is in use.
func (s *Store) DeleteImage(ctx context.Context, name string) (Image, error) {
	defer s.imagesChanged()
	var img Image
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		img, err = scanImage(tx.QueryRowContext(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, name))
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.New(errdefs.NotFound, "no image %q: see `clade image ls`", name)
		}
		if err != nil {
			return err
		}
		users, err := imageUsers(ctx, tx, name)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return errdefs.New(errdefs.Conflict, "image %s is in use by %s: remove them first", name, strings.Join(users, ", "))
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM images WHERE name = ?`, name)
		return err
	})
	return img, err
}

// AddImageRoot records a root filesystem this daemon is about to make, as
// pending: it is not collected until an image names it (PutImage) or
// FinishPendingImageRoots gives it up.
func (s *Store) AddImageRoot(ctx context.Context, rootfs string) error {
	_, err := s.exec(ctx, `INSERT OR REPLACE INTO image_roots (rootfs, pending) VALUES (?, 1)`, rootfs)
	return err
}

// FinishPendingImageRoots makes pending roots collectable: those of
// installs a killed daemon left (call it at start, before any install), or
// with roots, just those.
func (s *Store) FinishPendingImageRoots(ctx context.Context, roots ...string) error {
	if len(roots) == 0 {
		_, err := s.exec(ctx, `UPDATE image_roots SET pending = 0`)
		return err
	}
	for _, r := range roots {
		if _, err := s.exec(ctx, `UPDATE image_roots SET pending = 0 WHERE rootfs = ?`, r); err != nil {
			return err
		}
	}
	return nil
}

// CollectImageRoots returns the roots this daemon made that no image names
// and no sandbox or snapshot stands on, and forgets them, in one
// transaction: the caller removes them from disk.
func (s *Store) CollectImageRoots(ctx context.Context) ([]string, error) {
	var roots []string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT rootfs FROM image_roots WHERE pending = 0
			AND rootfs NOT IN (SELECT rootfs FROM images)
			AND rootfs NOT IN (SELECT rootfs FROM sandboxes)
			AND rootfs NOT IN (SELECT rootfs FROM snapshots)`)
		if roots, err = collect(rows, err, scanString); err != nil {
			return err
		}
		for _, r := range roots {
			if _, err := tx.ExecContext(ctx, `DELETE FROM image_roots WHERE rootfs = ?`, r); err != nil {
				return err
			}
		}
		return nil
	})
	return roots, err
}

// AddBuildSandbox marks the sandbox id as an image build's: it lives only
// as long as the build. The mark is the sandbox's own, not its options, so
// snapshots and fork children of it do not inherit it.
func (s *Store) AddBuildSandbox(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `INSERT OR IGNORE INTO build_sandboxes (id) VALUES (?)`, id)
	return err
}

// RemoveBuildSandbox drops the mark of AddBuildSandbox; a missing one is not
// an error.
func (s *Store) RemoveBuildSandbox(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM build_sandboxes WHERE id = ?`, id)
	return err
}

// BuildSandboxes returns the ids marked by AddBuildSandbox, recorded
// sandboxes or not.
func (s *Store) BuildSandboxes(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM build_sandboxes ORDER BY id`)
	return collect(rows, err, scanString)
}

// inTx runs fn in one transaction, committing if it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	if err := s.Check(); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.classify(err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback() // the error that made us roll back says more
		return s.classify(err)
	}
	if err := tx.Commit(); err != nil {
		return s.classify(fmt.Errorf("commit: %w", err))
	}
	return nil
}
