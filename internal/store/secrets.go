package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Secret is a secret's record: its name and current version. The values
// (one per version still in use) are sealed by package secret; the store
// never sees plaintext.
type Secret struct {
	Name      string
	Version   int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// SecretRef is a secret a sandbox takes, as recorded in its options: the
// version it got, and where (an environment variable, a file).
type SecretRef struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	Env     string `json:"env,omitempty"`
	File    string `json:"file,omitempty"`
}

const secretSchema = `
CREATE TABLE IF NOT EXISTS secrets (
	name       TEXT PRIMARY KEY,
	version    INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS secret_versions (
	name       TEXT NOT NULL,
	version    INTEGER NOT NULL,
	sealed     BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS key_check (
	id     INTEGER PRIMARY KEY CHECK (id = 1),
	sealed BLOB NOT NULL
);`

func init() { migrations = append(migrations, secretSchema) }

func scanSecret(row scanner) (Secret, error) {
	var sc Secret
	var created, updated int64
	if err := row.Scan(&sc.Name, &sc.Version, &created, &updated); err != nil {
		return Secret{}, err
	}
	sc.CreatedAt, sc.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	return sc, nil
}

// PutSecret records a new version of secret name (version 1 if it is new);
// seal makes the sealed value of that version. It returns the record.
func (s *Store) PutSecret(ctx context.Context, name string, seal func(version int) []byte) (Secret, error) {
	var sc Secret
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := time.Now()
		old, err := scanSecret(tx.QueryRowContext(ctx, `SELECT name, version, created_at, updated_at FROM secrets WHERE name = ?`, name))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			sc = Secret{Name: name, Version: 1, CreatedAt: now, UpdatedAt: now}
		case err != nil:
			return err
		default:
			sc = Secret{Name: name, Version: old.Version + 1, CreatedAt: old.CreatedAt, UpdatedAt: now}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO secret_versions (name, version, sealed, created_at) VALUES (?, ?, ?, ?)`,
			name, sc.Version, seal(sc.Version), now.UnixNano()); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO secrets (name, version, created_at, updated_at) VALUES (?, ?, ?, ?)`,
			name, sc.Version, sc.CreatedAt.UnixNano(), sc.UpdatedAt.UnixNano())
		return err
	})
	return sc, err
}

// GetSecret returns secret name's record; NotFound if there is none.
func (s *Store) GetSecret(ctx context.Context, name string) (Secret, error) {
	sc, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT name, version, created_at, updated_at FROM secrets WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, errdefs.New(errdefs.NotFound, "no secret %q: set it with `clade secret set %s`", name, name)
	}
	return sc, err
}

// SecretValue returns the sealed value of one version of a secret;
// NotFound if it is gone.
func (s *Store) SecretValue(ctx context.Context, name string, version int) ([]byte, error) {
	var sealed []byte
	err := s.db.QueryRowContext(ctx, `SELECT sealed FROM secret_versions WHERE name = ? AND version = ?`, name, version).Scan(&sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "secret %q has no version %d", name, version)
	}
	return sealed, err
}

// ListSecrets returns every secret, by name.
func (s *Store) ListSecrets(ctx context.Context) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, version, created_at, updated_at FROM secrets ORDER BY name`)
	return collect(rows, err, scanSecret)
}

// AllSealedSecrets returns every sealed value with its name and version,
// for a check that the key opens them all.
func (s *Store) AllSealedSecrets(ctx context.Context) (names []string, versions []int, sealed [][]byte, err error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, version, sealed FROM secret_versions ORDER BY name, version`)
	if err != nil {
		return nil, nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var v int
		var b []byte
		if err := rows.Scan(&n, &v, &b); err != nil {
			return nil, nil, nil, err
		}
		names, versions, sealed = append(names, n), append(versions, v), append(sealed, b)
	}
	return names, versions, sealed, rows.Err()
}

// DeleteSecret removes a secret and all its versions; a missing one is not
// an error.
func (s *Store) DeleteSecret(ctx context.Context, name string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM secret_versions WHERE name = ?`, name); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE name = ?`, name)
		return err
	})
}

// PruneSecretVersions deletes the versions of secret name older than its
// current one that keep does not list.
func (s *Store) PruneSecretVersions(ctx context.Context, name string, keep map[int]bool) error {
	rows, err := s.db.QueryContext(ctx, `SELECT v.version FROM secret_versions v JOIN secrets s ON s.name = v.name WHERE v.name = ? AND v.version < s.version`, name)
	old, err := collect(rows, err, func(r scanner) (int, error) {
		var v int
		return v, r.Scan(&v)
	})
	if err != nil {
		return err
	}
	for _, v := range old {
		if keep[v] {
			continue
		}
		if _, err := s.exec(ctx, `DELETE FROM secret_versions WHERE name = ? AND version = ?`, name, v); err != nil {
			return err
		}
	}
	return nil
}

// KeyCheck returns the sealed value that proves which key this database's
// secrets are sealed with; nil if none is recorded yet.
func (s *Store) KeyCheck(ctx context.Context) ([]byte, error) {
	var b []byte
	err := s.db.QueryRowContext(ctx, `SELECT sealed FROM key_check WHERE id = 1`).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return b, err
}

// SetKeyCheck records the key check value (once).
func (s *Store) SetKeyCheck(ctx context.Context, sealed []byte) error {
	_, err := s.exec(ctx, `INSERT OR IGNORE INTO key_check (id, sealed) VALUES (1, ?)`, sealed)
	return err
}
