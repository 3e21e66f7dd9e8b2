package store

import (
	"cmp"
	"context"
	"database/sql"
)

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

// unpoolQuery unmarks a pool's sandbox; prepared once (Store.unpool).
const unpoolQuery = `DELETE FROM pool_sandboxes WHERE id = ?`

// RemovePoolSandbox unmarks id: it was claimed or destroyed.
func (s *Store) RemovePoolSandbox(ctx context.Context, id string) error {
	_, err := s.exec(ctx, unpoolQuery, id)
	return err
}

// PoolSandboxes returns the ids marked by AddPoolSandbox.
func (s *Store) PoolSandboxes(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM pool_sandboxes ORDER BY id`)
	return collect(rows, err, scanString)
}

// ClaimPoolSandbox records sb, an engine sandbox the pool started under
// sb.ID, and unmarks it, in one transaction: a restart finds either the
// mark alone (unclaimed: destroyed) or the record alone. Errors as
// InsertSandbox's; on error the mark stays.
func (s *Store) ClaimPoolSandbox(ctx context.Context, sb Sandbox) error {
	sb.Node = cmp.Or(sb.Node, s.node)
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := insertSandbox(ctx, tx.StmtContext(ctx, s.insert), sb); err != nil {
			return err
		}
		_, err := tx.StmtContext(ctx, s.unpool).ExecContext(ctx, sb.ID)
		return err
	})
	if err == nil {
		s.idx.putLocked(sb.ID, indexRow{name: sb.Name, memoryMiB: sb.MemoryMiB, state: sb.State})
	}
	return err
}
