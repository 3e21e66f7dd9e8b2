package store

import (
	"context"
	"slices"
	"sync"
	"time"
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
	// since is when the row last began to hold memory (or the index was
	// loaded): Admissions lists the recent ones.
	since time.Time
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
	if old, ok := x.rows[id]; ok && holdsMemory(old.state) {
		r.since = old.since
	} else if holdsMemory(r.state) {
		r.since = time.Now()
	}
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

// Admissions is the memory committed to sandboxes (CommittedMemoryMiB)
// with which of them it counts lately, read at one moment: a cluster's
// placement stops counting a create, wake or move it sent a node once the
// node's capacity names it, so that it counts each exactly once.
type Admissions struct {
	// CommittedMiB is CommittedMemoryMiB; StartingMiB the part of it of
	// sandboxes being made or woken (creating, waking).
	CommittedMiB, StartingMiB int
	// Recent are the ids of the rows it counts that began to hold memory
	// within the window asked for, or are being made or woken; Starting
	// those being made or woken. Sorted.
	Recent, Starting []string
}

// Admissions reads the committed memory and the rows counted in it
// lately (within window).
func (s *Store) Admissions(window time.Duration) Admissions {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	a := Admissions{CommittedMiB: s.idx.committed}
	after := time.Now().Add(-window)
	for id, r := range s.idx.rows {
		if !holdsMemory(r.state) {
			continue
		}
		starting := r.state == StateCreating || r.state == StateWaking
		if starting {
			a.StartingMiB += r.memoryMiB
			a.Starting = append(a.Starting, id)
		}
		if starting || r.since.After(after) {
			a.Recent = append(a.Recent, id)
		}
	}
	slices.Sort(a.Recent)
	slices.Sort(a.Starting)
	return a
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
