// Package store keeps clade's metadata in SQLite (pure-Go driver, WAL). Every
// lifecycle transition is written here before and after the engine call, so a
// daemon killed at any point can finish or roll back on restart.
package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Sandbox states.
const (
	StateCreating   = "creating"
	StateRunning    = "running"
	StateStopped    = "stopped" // its engine sandbox died; only removal is left
	StateDestroying = "destroying"
	// StateSuspending is a sleep in progress; StateSleeping a finished one
	// (the sandbox is a snapshot on disk and holds no memory);
	// StateWaking a wake in progress.
	StateSuspending = "suspending"
	StateSleeping   = "sleeping"
	StateWaking     = "waking"
)

// Snapshot states.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
)

// Sandbox is a sandbox's record.
type Sandbox struct {
	ID        string
	Name      string
	Image     string
	State     string
	MemoryMiB int
	CPUs      float64
	Env       []string
	Error     string
	// Snapshot is the snapshot the sandbox was restored from, if any.
	Snapshot string
	// EngineID names the sandbox in the engine; empty means ID. A woken
	// sandbox may live in another engine sandbox than before it slept.
	EngineID string
	// RootFS is the image root the sandbox stands on: the image's root when
	// it was made, which outlives a replacement of the image.
	RootFS string
	// Opts are the sandbox's settings beyond its shape; fork children and
	// woken sandboxes keep them.
	Opts Options
	// Node names the node that holds the sandbox (Config.Node of the store
	// that recorded it, when the record names none).
	Node      string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Options are a sandbox's settings beyond its shape (image, memory, cpus,
// env). They are kept as one JSON column, so a feature adds a field here
// and needs no migration. Snapshots record them; fork children inherit them.
type Options struct {
	// DiskMiB caps what the sandbox may write (0: the daemon's default).
	DiskMiB int `json:"disk_mib,omitempty"`
	// Engine names the engine the sandbox runs in ("" the daemon's
	// default). Snapshots record it; fork children inherit it.
	Engine string `json:"engine,omitempty"`
	// Labels are the user's key=value labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Network is the sandbox's network settings; nil means loopback only.
	Network *NetworkOptions `json:"network,omitempty"`
	// Public lets the ingress serve the sandbox's ports to requests
	// without its traffic token.
	Public bool `json:"public,omitempty"`
	// TrafficToken is what ingress requests to the sandbox's ports carry
	// (header X-Clade-Traffic-Token). Each sandbox gets its own; fork
	// children get new ones.
	TrafficToken string `json:"traffic_token,omitempty"`
	// HostMask, when set, is the Host the ingress sends the sandbox's
	// servers instead of the client's, ${PORT} replaced by the port
	// (E2B's maskRequestHost).
	HostMask string `json:"host_mask,omitempty"`
	// IdleSleepMS puts the sandbox to sleep after this long without an
	// exec, a file transfer or ingress traffic (0: never).
	IdleSleepMS int64 `json:"idle_sleep_ms,omitempty"`
	// TimeoutMS is the sandbox's lifetime from its creation, its last
	// renewal or its wake after a timeout sleep (0: none); ExpiresAt is
	// when the current one ends, and OnTimeout ("rm", "sleep" or "sleep-files") what
	// happens then.
	TimeoutMS int64      `json:"timeout_ms,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	OnTimeout string     `json:"on_timeout,omitempty"`
	// Volumes are the volumes the sandbox mounts (package volume).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Secrets are the secrets the sandbox takes (package secret).
	Secrets []SecretRef `json:"secrets,omitempty"`
}

// NetworkOptions are a sandbox's network mode and egress policy.
type NetworkOptions struct {
	// Mode is "internet" or "none".
	Mode string `json:"mode,omitempty"`
	// Egress is "allow" or "deny": what happens to destinations no rule names.
	Egress string `json:"egress,omitempty"`
	// Allow lists HOST, *.DOMAIN or CIDR rules; any entry makes the policy
	// an allowlist. Deny lists CIDRs that are always refused.
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Snapshot is a snapshot's record.
type Snapshot struct {
	ID        string
	Name      string
	Sandbox   string
	Image     string
	State     string
	MemoryMiB int
	CPUs      float64
	Env       []string
	Path      string
	SizeBytes int64
	Implicit  bool
	// RootFS is the image root the snapshotted sandbox stood on.
	RootFS string
	// Opts are the snapshotted sandbox's options; its children inherit them.
	Opts Options
	// Node names the node that holds the snapshot's files.
	Node      string
	CreatedAt time.Time
}

// Store is the metadata database.
type Store struct {
	db   *sql.DB
	path string
	// dev and ino identify the database file that was opened: a file
	// removed or replaced under the daemon is noticed by its identity.
	dev, ino uint64
	node     string  // Config.Node
	reserve  reserve // room for removals on a full disk (reserve.go)
	// idx mirrors the sandboxes table for creates (index.go); its mu is
	// held across every write to the table.
	idx index

	// insert and unpool are insertQuery and unpoolQuery, prepared at Open.
	insert, unpool *sql.Stmt

	imgMu    sync.Mutex
	imgCache map[string]Image // guarded by imgMu: records by name (GetImage)
	imgGen   uint64           // guarded by imgMu: bumped by every image write
}

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id         TEXT PRIMARY KEY,
	name       TEXT UNIQUE,
	image      TEXT NOT NULL,
	state      TEXT NOT NULL,
	memory_mib INTEGER NOT NULL,
	cpus       REAL NOT NULL,
	env        TEXT NOT NULL,
	error      TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
	id         TEXT PRIMARY KEY,
	name       TEXT UNIQUE,
	sandbox    TEXT NOT NULL,
	image      TEXT NOT NULL,
	state      TEXT NOT NULL,
	memory_mib INTEGER NOT NULL,
	cpus       REAL NOT NULL,
	env        TEXT NOT NULL,
	path       TEXT NOT NULL,
	size_bytes INTEGER NOT NULL DEFAULT 0,
	implicit   INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);`

// migrations bring databases made by older versions up to the schema; each
// may fail with "duplicate column" when already applied.
var migrations = []string{
	`ALTER TABLE sandboxes ADD COLUMN snapshot TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE sandboxes ADD COLUMN engine_id TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE sandboxes ADD COLUMN rootfs TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE snapshots ADD COLUMN rootfs TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE sandboxes ADD COLUMN opts TEXT NOT NULL DEFAULT '{}'`,
	`ALTER TABLE snapshots ADD COLUMN opts TEXT NOT NULL DEFAULT '{}'`,
	`ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE snapshots ADD COLUMN node TEXT NOT NULL DEFAULT ''`,
}

// Engine returns the sandbox's id in the engine.
func (sb Sandbox) Engine() string {
	if sb.EngineID != "" {
		return sb.EngineID
	}
	return sb.ID
}

// Config is a store's configuration beyond its file.
type Config struct {
	// Node names this node in the records it writes (Sandbox.Node,
	// Snapshot.Node); empty: DefaultNode. Records of an older database,
	// which name none, are read as this node's.
	Node string
}

// DefaultNode is the node of a store configured with none: a daemon that
// is not part of a cluster.
const DefaultNode = "local"

// Open opens (creating if needed) the database at path, for DefaultNode.
func Open(ctx context.Context, path string) (*Store, error) {
	return OpenConfig(ctx, path, Config{})
}

// OpenConfig opens (creating if needed) the database at path.
func OpenConfig(ctx context.Context, path string, cfg Config) (*Store, error) {
	// secure_delete: deleted rows are zeroed, so that a removed encrypted
	// volume's sealed key (in its record and its copies' options) is not
	// left in a free page.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_pragma=secure_delete(1)")
	if err != nil {
		return nil, err
	}
	// One writer at a time is what SQLite allows; one connection avoids
	// SQLITE_BUSY between our own goroutines.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	for _, m := range migrations {
		if _, err := db.ExecContext(ctx, m); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			db.Close()
			return nil, fmt.Errorf("migrate store %s: %w", path, err)
		}
	}
	st := &Store{db: db, path: path, node: cmp.Or(cfg.Node, DefaultNode)}
	// Records from before nodes are this node's.
	for _, q := range []string{`UPDATE sandboxes SET node = ? WHERE node = ''`, `UPDATE snapshots SET node = ? WHERE node = ''`} {
		if _, err := db.ExecContext(ctx, q, st.node); err != nil {
			db.Close()
			return nil, fmt.Errorf("migrate store %s: %w", path, err)
		}
	}
	if st.insert, err = db.PrepareContext(ctx, insertQuery); err == nil {
		st.unpool, err = db.PrepareContext(ctx, unpoolQuery)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	var fi unix.Stat_t
	if err := unix.Stat(path, &fi); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	st.dev, st.ino = fi.Dev, fi.Ino
	st.reserve.path = path + ".reserve"
	st.reserve.make()
	if err := st.idx.load(ctx, st); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return st, nil
}

// Node returns the node the store records (Config.Node).
func (s *Store) Node() string { return s.node }

// Check reports whether the database file is still the one the store
// opened. A removed or replaced file is an Unavailable error: writes to the
// old, unlinked file would be lost at the next start, so the store refuses
// them (every write checks) until the daemon is restarted on a good file.
func (s *Store) Check() error {
	var fi unix.Stat_t
	err := unix.Stat(s.path, &fi)
	if err == nil && fi.Dev == s.dev && fi.Ino == s.ino {
		return nil
	}
	what := "replaced"
	if err != nil {
		what = "removed"
	}
	return errdefs.New(errdefs.Unavailable, "the database %s was %s under the running daemon: it refuses changes so that nothing is lost; put the file back (or stop the daemon, restore it from a backup) and restart the daemon", s.path, what)
}

// exec runs a write, after checking that the database file is still ours.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	var res sql.Result
	err := s.write(ctx, func() (err error) {
		res, err = s.db.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// classify says that an error from a write the full disk refused is
// ResourceExhausted (a retryable 429), not an internal error.
func (s *Store) classify(err error) error {
	if isFull(err) {
		return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("the disk holding the database %s is full: free some space and retry: %w", s.path, err))
	}
	return err
}

// sqliteFull is SQLITE_FULL, the primary result code of a write that found
// the disk full.
const sqliteFull = 13

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// InsertSandbox records a new sandbox. A taken name or id is AlreadyExists.
func (s *Store) InsertSandbox(ctx context.Context, sb Sandbox) error {
	if err := s.Check(); err != nil {
		return err
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	sb.Node = cmp.Or(sb.Node, s.node)
	err := s.write(ctx, func() error { return insertSandbox(ctx, s.insert, sb) })
	if err == nil {
		s.idx.putLocked(sb.ID, indexRow{name: sb.Name, memoryMiB: sb.MemoryMiB, state: sb.State})
	}
	return err
}

// insertQuery records a sandbox; prepared once (Store.insert): parsing it
// was a fifth of a claim's store CPU.
const insertQuery = `INSERT INTO sandboxes (id, name, image, state, memory_mib, cpus, env, error, snapshot, rootfs, opts, node, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// insertSandbox runs insert, the prepared insertQuery (of the database or
// of a transaction).
func insertSandbox(ctx context.Context, insert *sql.Stmt, sb Sandbox) error {
	env, _ := json.Marshal(sb.Env)
	opts, _ := json.Marshal(sb.Opts)
	now := sb.CreatedAt
	if now.IsZero() {
		now = time.Now()
	}
	_, err := insert.ExecContext(ctx, sb.ID, nullable(sb.Name), sb.Image, sb.State, sb.MemoryMiB, sb.CPUs, string(env), sb.Error, sb.Snapshot, sb.RootFS, string(opts), sb.Node, now.UnixNano(), now.UnixNano())
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		if strings.Contains(err.Error(), "name") {
			return errdefs.New(errdefs.AlreadyExists, "a sandbox named %q already exists: pick another --name or remove it", sb.Name)
		}
		return errdefs.New(errdefs.AlreadyExists, "sandbox %s already exists", sb.ID)
	}
	return err
}

// SetState moves a sandbox to state, recording msg as its last error.
func (s *Store) SetState(ctx context.Context, id, state, msg string) error {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	res, err := s.exec(ctx, `UPDATE sandboxes SET state = ?, error = ?, updated_at = ? WHERE id = ?`,
		state, msg, time.Now().UnixNano(), id)
	if err != nil {
		return err
	}
	s.idx.setStateLocked(id, state)
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "no such sandbox: %s", id)
	}
	return nil
}

// Transition moves a sandbox from state from to state to, recording msg as
// its last error. It fails with Conflict when the sandbox is no longer in
// state from (someone else moved it) and NotFound when it is gone.
func (s *Store) Transition(ctx context.Context, id, from, to, msg string) error {
	s.idx.mu.Lock()
	res, err := s.exec(ctx, `UPDATE sandboxes SET state = ?, error = ?, updated_at = ? WHERE id = ? AND state = ?`,
		to, msg, time.Now().UnixNano(), id, from)
	n := int64(0)
	if err == nil {
		if n, _ = res.RowsAffected(); n == 1 {
			s.idx.setStateLocked(id, to)
		}
	}
	s.idx.mu.Unlock()
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	cur, err := s.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	return errdefs.New(errdefs.Conflict, "sandbox %s is %s, not %s", id, cur.State, from)
}

// TransitionAll moves every sandbox of ids from state from to state to in
// one transaction: all of them or none (a fork's children become running
// together, so a daemon killed in between leaves none half told).
func (s *Store) TransitionAll(ctx context.Context, ids []string, from, to string) error {
	if len(ids) == 0 {
		return nil
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	now := time.Now().UnixNano()
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, id := range ids {
			res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, error = '', updated_at = ? WHERE id = ? AND state = ?`, to, now, id, from)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return errdefs.New(errdefs.Conflict, "sandbox %s is not %s", id, from)
			}
		}
		return nil
	})
	if err == nil {
		for _, id := range ids {
			s.idx.setStateLocked(id, to)
		}
	}
	return err
}

const cols = `id, COALESCE(name, ''), image, state, memory_mib, cpus, env, error, snapshot, engine_id, rootfs, opts, node, created_at, updated_at`

func scan(row scanner) (Sandbox, error) {
	var sb Sandbox
	var env, opts string
	var created, updated int64
	if err := row.Scan(&sb.ID, &sb.Name, &sb.Image, &sb.State, &sb.MemoryMiB, &sb.CPUs, &env, &sb.Error, &sb.Snapshot, &sb.EngineID, &sb.RootFS, &opts, &sb.Node, &created, &updated); err != nil {
		return Sandbox{}, err
	}
	_ = json.Unmarshal([]byte(env), &sb.Env)
	_ = json.Unmarshal([]byte(opts), &sb.Opts)
	sb.CreatedAt, sb.UpdatedAt = time.Unix(0, created), time.Unix(0, updated)
	return sb, nil
}

// SetOptions replaces a sandbox's options (e.g. a changed egress policy).
func (s *Store) SetOptions(ctx context.Context, id string, o Options) error {
	b, _ := json.Marshal(o)
	res, err := s.exec(ctx, `UPDATE sandboxes SET opts = ?, updated_at = ? WHERE id = ?`, string(b), time.Now().UnixNano(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "no such sandbox: %s", id)
	}
	return nil
}

// SetEngineID records the engine sandbox that holds a sandbox.
func (s *Store) SetEngineID(ctx context.Context, id, engineID string) error {
	_, err := s.exec(ctx, `UPDATE sandboxes SET engine_id = ?, updated_at = ? WHERE id = ?`, engineID, time.Now().UnixNano(), id)
	return err
}

// GetSandbox finds a sandbox by id or name.
func (s *Store) GetSandbox(ctx context.Context, ref string) (Sandbox, error) {
	sb, err := scan(s.db.QueryRowContext(ctx, `SELECT `+cols+` FROM sandboxes WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, errdefs.New(errdefs.NotFound, "no such sandbox: %s (see `clade ls`)", ref)
	}
	return sb, err
}

// ListSandboxes returns every sandbox, oldest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+cols+` FROM sandboxes ORDER BY created_at, id`)
	return collect(rows, err, scan)
}

// scanner is a row to scan: *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// collect scans every row of a query (rows, err as QueryContext returned
// them) with scan, and closes rows.
func collect[T any](rows *sql.Rows, err error, scan func(scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// scanString scans a one-column text row.
func scanString(row scanner) (string, error) {
	var v string
	err := row.Scan(&v)
	return v, err
}

// CommittedMemoryMiB returns the sum of the memory limits of the sandboxes
// that hold (or are about to hold) memory: all but the sleeping and stopped.
func (s *Store) CommittedMemoryMiB(ctx context.Context) (int, error) {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	return s.idx.committed, nil
}

// DeleteSandbox removes a sandbox's record; a missing one is not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	_, err := s.exec(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err == nil {
		s.idx.dropLocked(id)
	}
	return err
}

// InsertSnapshot records a new snapshot. A taken name is AlreadyExists.
func (s *Store) InsertSnapshot(ctx context.Context, sn Snapshot) error {
	env, _ := json.Marshal(sn.Env)
	opts, _ := json.Marshal(sn.Opts)
	_, err := s.exec(ctx, `INSERT INTO snapshots (id, name, sandbox, image, state, memory_mib, cpus, env, path, size_bytes, implicit, rootfs, opts, node, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, nullable(sn.Name), sn.Sandbox, sn.Image, sn.State, sn.MemoryMiB, sn.CPUs, string(env), sn.Path, sn.SizeBytes, sn.Implicit, sn.RootFS, string(opts), cmp.Or(sn.Node, s.node), cmp.Or(sn.CreatedAt, time.Now()).UnixNano())
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return errdefs.New(errdefs.AlreadyExists, "a snapshot named %q already exists: pick another --name or remove it", sn.Name)
	}
	return err
}

// SetSnapshotImplicit makes a snapshot go with its last user.
func (s *Store) SetSnapshotImplicit(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `UPDATE snapshots SET implicit = 1 WHERE id = ?`, id)
	return err
}

// SetSnapshotReady marks a snapshot complete with its size on disk.
func (s *Store) SetSnapshotReady(ctx context.Context, id string, size int64) error {
	_, err := s.exec(ctx, `UPDATE snapshots SET state = ?, size_bytes = ? WHERE id = ?`, SnapshotReady, size, id)
	return err
}

const snapCols = `id, COALESCE(name, ''), sandbox, image, state, memory_mib, cpus, env, path, size_bytes, implicit, rootfs, opts, node, created_at`

func scanSnapshot(row scanner) (Snapshot, error) {
	var sn Snapshot
	var env, opts string
	var created int64
	if err := row.Scan(&sn.ID, &sn.Name, &sn.Sandbox, &sn.Image, &sn.State, &sn.MemoryMiB, &sn.CPUs, &env, &sn.Path, &sn.SizeBytes, &sn.Implicit, &sn.RootFS, &opts, &sn.Node, &created); err != nil {
		return Snapshot{}, err
	}
	_ = json.Unmarshal([]byte(env), &sn.Env)
	_ = json.Unmarshal([]byte(opts), &sn.Opts)
	sn.CreatedAt = time.Unix(0, created)
	return sn, nil
}

// GetSnapshot finds a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, ref string) (Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapCols+` FROM snapshots WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, errdefs.New(errdefs.NotFound, "no such snapshot: %s (see `clade snapshot ls`)", ref)
	}
	return sn, err
}

// ListSnapshots returns every snapshot, oldest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+snapCols+` FROM snapshots ORDER BY created_at, id`)
	return collect(rows, err, scanSnapshot)
}

// SnapshotUsers returns the ids of the sandboxes restored from a snapshot.
func (s *Store) SnapshotUsers(ctx context.Context, id string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM sandboxes WHERE snapshot = ? ORDER BY created_at, id`, id)
	return collect(rows, err, scanString)
}

// DeleteSnapshot removes a snapshot's record; a missing one is not an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	return err
}
