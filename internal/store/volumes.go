package store

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Volume is a named volume's record. Its bytes are files the volume
// package keeps under the daemon's volume directory, named by ID.
type Volume struct {
	ID        string
	Name      string
	SizeBytes int64
	// State is VolumeCreating until the volume's file system is made, and
	// VolumeRemoving once its removal began: a restart finishes or undoes
	// both.
	State     string
	CreatedAt time.Time
	// Key, for an encrypted volume, is its own key sealed under the host
	// key (package volume); nil for a plain one.
	Key []byte
}

// Encrypted says whether the volume has its own key.
func (v Volume) Encrypted() bool { return len(v.Key) > 0 }

// Volume states.
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
	VolumeRemoving = "removing"
)

// VolumeMount is one volume a sandbox mounts, as recorded in its options.
type VolumeMount struct {
	// Volume is the named volume's id; Name its name when mounted.
	Volume string `json:"volume"`
	Name   string `json:"name"`
	// Path is where the sandbox sees it.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Shared: fork children mount this same volume instead of a copy.
	Shared bool `json:"shared,omitempty"`
	// Clone, when set, says this sandbox mounts its own copy of the volume
	// as it was in the snapshot it was restored from, and how the copy was
	// made ("reflink" or "copy"); empty means the named volume itself.
	Clone string `json:"clone,omitempty"`
	// Key is the encrypted volume's key sealed under the host key (its
	// copies, in snapshots and fork children, share it and keep it here
	// after the named volume is removed); nil for a plain volume.
	Key []byte `json:"key,omitempty"`
}

const volumeSchema = `
CREATE TABLE IF NOT EXISTS volumes (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	size_bytes INTEGER NOT NULL,
	state      TEXT NOT NULL,
	created_at INTEGER NOT NULL
);`

func init() {
	migrations = append(migrations, volumeSchema, `ALTER TABLE volumes ADD COLUMN sealed_key BLOB`)
}

const volumeCols = `id, name, size_bytes, state, created_at, sealed_key`

func scanVolume(row scanner) (Volume, error) {
	var v Volume
	var created int64
	if err := row.Scan(&v.ID, &v.Name, &v.SizeBytes, &v.State, &created, &v.Key); err != nil {
		return Volume{}, err
	}
	v.CreatedAt = time.Unix(0, created).UTC()
	return v, nil
}

// InsertVolume records a new volume. A taken name is AlreadyExists.
func (s *Store) InsertVolume(ctx context.Context, v Volume) error {
	if v.CreatedAt.IsZero() {
		v.CreatedAt = time.Now()
	}
	_, err := s.exec(ctx, `INSERT INTO volumes (`+volumeCols+`) VALUES (?, ?, ?, ?, ?, ?)`, v.ID, v.Name, v.SizeBytes, v.State, v.CreatedAt.UnixNano(), v.Key)
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return errdefs.New(errdefs.AlreadyExists, "a volume named %q already exists: pick another name or remove it with `clade volume rm %s`", v.Name, v.Name)
	}
	return err
}

// SetVolumeState changes a volume's state; NotFound if it is gone.
func (s *Store) SetVolumeState(ctx context.Context, id, state string) error {
	res, err := s.exec(ctx, `UPDATE volumes SET state = ? WHERE id = ?`, state, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "no such volume: %s", id)
	}
	return nil
}

// SetVolumeImported records an imported volume's size and makes it ready.
func (s *Store) SetVolumeImported(ctx context.Context, id string, size int64) error {
	res, err := s.exec(ctx, `UPDATE volumes SET size_bytes = ?, state = ? WHERE id = ?`, size, VolumeReady, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "no such volume: %s", id)
	}
	return nil
}

// GetVolume finds a volume by id or name.
func (s *Store) GetVolume(ctx context.Context, ref string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Volume{}, errdefs.New(errdefs.NotFound, "no such volume: %s (see `clade volume ls`)", ref)
	}
	return v, err
}

// ListVolumes returns every volume, by name.
func (s *Store) ListVolumes(ctx context.Context) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+volumeCols+` FROM volumes ORDER BY name`)
	return collect(rows, err, scanVolume)
}

// DeleteVolume removes a volume's record; a missing one is not an error.
// The store deletes with secure_delete on (see Open), so the freed space
// does not keep an encrypted volume's sealed key; the WAL is checkpointed
// and truncated so that no old page there holds it either.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	res, err := s.exec(ctx, `DELETE FROM volumes WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		_, err = s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	return err
}
