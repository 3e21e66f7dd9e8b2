package store

import (
	"context"
	"sync"
)

// index mirrors, in memory, what a create asks of the sandboxes table on
// its path: the memory committed to sandboxes that hold memory (admission)
// and which ids and names are taken. Each was a query of 0.2-0.5 ms on this
// host under load; a hot-pool claim made three. Every write to the table
// goes through the Store and updates the index under mu with the write
// itself, so the index is the table's state, not an estimate: only this
// process writes the database (the daemon's lock).
type index struct {
	mu        sync.Mutex
	rows      map[string]indexRow // by id
	names     map[string]string   // name -> id
	committed int                 // sum of memory of rows that hold memory
}

type indexRow struct {
	name      string
	memoryMiB int
	state     string
}

// holdsMemory says whether a sandbox in state counts against the
// overcommit limit: all but the sleeping and the stopped.
func holdsMemory(state string) bool { return state != StateSleeping && state != StateStopped }

func (x *index) load(ctx context.Context, s *Store) error {
	rows, err := s.db.QueryContext(ctx, `SELECT id, COALESCE(name, ''), memory_mib, state FROM sandboxes`)
	if err != nil {
		return err
	}
	defer rows.Close()
	x.rows, x.names, x.committed = map[string]indexRow{}, map[string]string{}, 0
	for rows.Next() {
		var id string
		var r indexRow
		if err := rows.Scan(&id, &r.name, &r.memoryMiB, &r.state); err != nil {
			return err
		}
		x.putLocked(id, r)
	}
	return rows.Err()
}

func (x *index) putLocked(id string, r indexRow) {
	x.dropLocked(id)
	x.rows[id] = r
	if r.name != "" {
		x.names[r.name] = id
	}
	if holdsMemory(r.state) {
		x.committed += r.memoryMiB
	}
}

func (x *index) dropLocked(id string) {
	old, ok := x.rows[id]
	if !ok {
		return
	}
	delete(x.rows, id)
	if old.name != "" && x.names[old.name] == id {
		delete(x.names, old.name)
	}
	if holdsMemory(old.state) {
		x.committed -= old.memoryMiB
	}
}

func (x *index) setStateLocked(id, state string) {
	if r, ok := x.rows[id]; ok {
		r.state = state
		x.putLocked(id, r)
	}
}

// taken says whether ref is a sandbox's id or name.
func (x *index) taken(ref string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, id := x.rows[ref]
	_, name := x.names[ref]
	return id || name
}

// Taken reports whether ref is the id or the name of a recorded sandbox,
// as GetSandbox(ref) finding one would, without a query.
func (s *Store) Taken(ref string) bool { return s.idx.taken(ref) }
