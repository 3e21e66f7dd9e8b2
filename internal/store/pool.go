package store

import "context"

// poolSchema records the engine sandboxes the hot pool started: they run
// with no sandbox record until a create claims one, and a restart must
// tell them from started sandboxes whose records were lost (which it
// keeps).
const poolSchema = `
CREATE TABLE IF NOT EXISTS pool_sandboxes (
	id TEXT PRIMARY KEY
);`

func init() { migrations = append(migrations, poolSchema) }

// AddPoolSandbox marks id as a pool's, before its engine sandbox starts.
func (s *Store) AddPoolSandbox(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `INSERT OR IGNORE INTO pool_sandboxes (id) VALUES (?)`, id)
	return err
}

// RemovePoolSandbox unmarks id: it was claimed or destroyed.
func (s *Store) RemovePoolSandbox(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM pool_sandboxes WHERE id = ?`, id)
	return err
}

// PoolSandboxes returns the ids marked by AddPoolSandbox.
func (s *Store) PoolSandboxes(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM pool_sandboxes ORDER BY id`)
	return collect(rows, err, scanString)
}
