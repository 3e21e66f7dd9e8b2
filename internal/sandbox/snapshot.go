package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// lockOp serializes the operations that change one sandbox (snapshot, sleep,
// wake, remove); operations on different sandboxes run in parallel.
func (m *Manager) lockOp(id string) func() {
	m.mu.Lock()
	l := m.ops[id]
	if l == nil {
		l = &sync.Mutex{}
		m.ops[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// lockSandbox finds a sandbox, takes its operation lock and reads it again
// under the lock: what a snapshot, sleep or wake decides on must be current.
func (m *Manager) lockSandbox(ctx context.Context, ref string) (store.Sandbox, func(), error) {
	rec, err := m.store.GetSandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, nil, err
	}
	unlock := m.lockOp(rec.ID)
	if rec, err = m.store.GetSandbox(ctx, rec.ID); err != nil {
		unlock()
		return store.Sandbox{}, nil, err
	}
	return rec, unlock, nil
}

func (m *Manager) snapshotter() (engine.Snapshotter, error) {
	s, ok := m.eng.(engine.Snapshotter)
	if !ok {
		return nil, errdefs.New(errdefs.InvalidArgument, "the %s engine cannot snapshot", m.eng.Name())
	}
	return s, nil
}

// Snapshot freezes a running sandbox into a new snapshot; the sandbox keeps
// running. Implicit snapshots (made by a fork of a sandbox) are removed with
// their last child.
func (m *Manager) Snapshot(ctx context.Context, ref, name string, implicit bool) (store.Snapshot, error) {
	snapper, err := m.snapshotter()
	if err != nil {
		return store.Snapshot{}, err
	}
	if name != "" && !nameRE.MatchString(name) {
		return store.Snapshot{}, errdefs.New(errdefs.InvalidArgument, "bad snapshot name %q: use 1-63 letters, digits, '_', '.' or '-'", name)
	}
	rec, unlock, err := m.lockSandbox(ctx, ref)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer unlock()
	if rec.State != store.StateRunning {
		return store.Snapshot{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a running sandbox can be snapshotted", ref, rec.State)
	}
	id := newID()
	sn := store.Snapshot{ID: id, Name: name, Sandbox: rec.ID, Image: rec.Image, State: store.SnapshotCreating,
		MemoryMiB: rec.MemoryMiB, CPUs: rec.CPUs, Env: rec.Env, Path: filepath.Join(m.cfg.SnapshotDir, id), Implicit: implicit,
		RootFS: rec.RootFS, Opts: rec.Opts}
	if err := m.store.InsertSnapshot(ctx, sn); err != nil {
		return store.Snapshot{}, err
	}
	ctx = context.WithoutCancel(ctx)
	m.crashPoint("snapshot-before-engine")
	if err := snapper.Checkpoint(ctx, rec.Engine(), sn.Path, true); err != nil {
		return store.Snapshot{}, errors.Join(fmt.Errorf("snapshot %s: %w", ref, err), os.RemoveAll(sn.Path), m.store.DeleteSnapshot(ctx, id))
	}
	sn.SizeBytes = image.DirSize(sn.Path)
	if err := m.store.SetSnapshotReady(ctx, id, sn.SizeBytes); err != nil {
		return store.Snapshot{}, err
	}
	sn.State = store.SnapshotReady
	m.log.Info("snapshot taken", "snapshot", id, "sandbox", rec.ID, "size_mib", sn.SizeBytes>>20)
	return sn, nil
}

// GetSnapshot returns a snapshot and the sandboxes restored from it.
func (m *Manager) GetSnapshot(ctx context.Context, ref string) (store.Snapshot, []string, error) {
	sn, err := m.store.GetSnapshot(ctx, ref)
	if err != nil {
		return store.Snapshot{}, nil, err
	}
	users, err := m.store.SnapshotUsers(ctx, sn.ID)
	return sn, users, err
}

// ListSnapshots returns every snapshot.
func (m *Manager) ListSnapshots(ctx context.Context) ([]store.Snapshot, error) {
	return m.store.ListSnapshots(ctx)
}

// DeleteSnapshot removes a snapshot nobody uses.
func (m *Manager) DeleteSnapshot(ctx context.Context, ref string) error {
	sn, err := m.store.GetSnapshot(ctx, ref)
	if err != nil {
		return err
	}
	unlock := m.lockOp(sn.ID)
	defer unlock()
	users, err := m.store.SnapshotUsers(ctx, sn.ID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return errdefs.New(errdefs.Conflict, "snapshot %s is in use by %d sandbox(es): %s; remove them first", ref, len(users), strings.Join(users, ", "))
	}
	if sn.State == store.SnapshotCreating {
		return errdefs.New(errdefs.Conflict, "snapshot %s is still being taken", ref)
	}
	return m.removeSnapshot(ctx, sn)
}

func (m *Manager) removeSnapshot(ctx context.Context, sn store.Snapshot) error {
	if err := os.RemoveAll(sn.Path); err != nil {
		return err
	}
	if err := m.store.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	m.log.Info("snapshot removed", "snapshot", sn.ID)
	m.gcStaleRoot(ctx, sn.Image, sn.RootFS)
	return nil
}

// gcSnapshot removes an implicit snapshot once no sandbox uses it.
func (m *Manager) gcSnapshot(ctx context.Context, id string) {
	if id == "" {
		return
	}
	unlock := m.lockOp(id)
	defer unlock()
	sn, err := m.store.GetSnapshot(ctx, id)
	if err != nil || !sn.Implicit || sn.State != store.SnapshotReady {
		return
	}
	if users, err := m.store.SnapshotUsers(ctx, id); err == nil && len(users) == 0 {
		if err := m.removeSnapshot(ctx, sn); err != nil {
			m.log.Warn("remove unused implicit snapshot", "snapshot", id, "err", err)
		}
	}
}

// ForkChild is the outcome for one child.
type ForkChild struct {
	ID  string
	Err error
}

// ForkResult is the outcome of a fork.
type ForkResult struct {
	Snapshot string
	Children []ForkChild
}

// Fork restores n new sandboxes from source: a snapshot, or a running
// sandbox that is snapshotted first (implicitly; the snapshot goes with its
// last child). It answers per child; an error means nothing was attempted.
func (m *Manager) Fork(ctx context.Context, source string, n int) (ForkResult, error) {
	if n < 1 {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "n must be at least 1")
	}
	if n > m.cfg.MaxFork {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "n=%d is above the maximum of %d children per fork (daemon flag --max-fork)", n, m.cfg.MaxFork)
	}
	recs := make([]store.Sandbox, n)
	return m.fork(ctx, source, recs)
}

// fork fills in recs (names may be preset) and restores them from source.
func (m *Manager) fork(ctx context.Context, source string, recs []store.Sandbox) (ForkResult, error) {
	snapper, err := m.snapshotter()
	if err != nil {
		return ForkResult{}, err
	}
	sn, err := m.store.GetSnapshot(ctx, source)
	if errdefs.IsNotFound(err) {
		parent, perr := m.store.GetSandbox(ctx, source)
		if errdefs.IsNotFound(perr) {
			return ForkResult{}, errdefs.New(errdefs.NotFound, "no snapshot or sandbox called %s (see `clade snapshot ls` and `clade ls`)", source)
		}
		if perr != nil {
			return ForkResult{}, perr
		}
		release, err := m.admit(len(recs) * parent.MemoryMiB)
		if err != nil {
			return ForkResult{}, err
		}
		defer release()
		if sn, err = m.Snapshot(ctx, parent.ID, "", true); err != nil {
			return ForkResult{}, err
		}
	} else if err != nil {
		return ForkResult{}, err
	} else {
		if sn.State != store.SnapshotReady {
			return ForkResult{}, errdefs.New(errdefs.Conflict, "snapshot %s is still being taken", source)
		}
		release, err := m.admit(len(recs) * sn.MemoryMiB)
		if err != nil {
			return ForkResult{}, err
		}
		defer release()
	}
	img, err := m.images.Get(ctx, sn.Image)
	if err != nil {
		return ForkResult{}, fmt.Errorf("image %s of snapshot %s: %w", sn.Image, sn.ID, err)
	}
	ctx = context.WithoutCancel(ctx) // children are made whole or not at all
	res := ForkResult{Snapshot: sn.ID, Children: make([]ForkChild, len(recs))}
	sh := shapeOf(sn.Image, sn.MemoryMiB, sn.CPUs, sn.Env, sn.Opts.Network)
	// Keep as many prepared for the next fork of this shape.
	defer m.pool.want(sh, len(recs), m.cfg.WarmPool)
	for i := range recs {
		id, ok := m.pool.take(sh)
		if !ok {
			id = newID()
		}
		opts := sn.Opts
		if recs[i].Opts.Network != nil { // a template sandbox's own policy
			opts.Network = recs[i].Opts.Network
		}
		recs[i] = store.Sandbox{ID: id, Name: recs[i].Name, Image: sn.Image, State: store.StateCreating,
			MemoryMiB: sn.MemoryMiB, CPUs: sn.CPUs, Env: sn.Env, Snapshot: sn.ID, RootFS: sn.RootFS, Opts: opts}
		if err := m.store.InsertSandbox(ctx, recs[i]); err != nil {
			res.Children[i].Err = err
			recs[i].ID = ""
		}
	}
	sem := make(chan struct{}, m.cfg.RestoreParallel)
	var wg sync.WaitGroup
	for i, rec := range recs {
		if rec.ID == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res.Children[i] = m.restoreChild(ctx, snapper, rec, img, sn.Path)
		}()
	}
	wg.Wait()
	m.crashPoint("fork-after-children")
	m.gcSnapshot(ctx, sn.ID) // an implicit snapshot whose every child failed
	return res, nil
}

func (m *Manager) restoreChild(ctx context.Context, snapper engine.Snapshotter, rec store.Sandbox, img image.Image, path string) ForkChild {
	defer m.markBusy(rec.ID)()
	spec := m.spec(rec, img)
	var sb engine.Sandbox
	err := m.beforeStart(ctx, rec, &spec)
	if err == nil {
		sb, err = snapper.Restore(ctx, spec, path)
		if err == nil {
			err = m.afterStart(ctx, rec, sb)
			if err == nil {
				err = m.store.SetState(ctx, rec.ID, store.StateRunning, "")
			}
			if err != nil {
				err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()))
			}
		}
		if err != nil {
			err = errors.Join(err, m.afterStop(ctx, rec), m.afterRemove(ctx, rec))
		}
	}
	if err != nil {
		return ForkChild{Err: errors.Join(fmt.Errorf("restore child: %w", err), m.store.DeleteSandbox(ctx, rec.ID))}
	}
	m.track(rec.ID, sb)
	m.crashPoint("fork-mid-restore") // other children still restoring
	return ForkChild{ID: rec.ID}
}

// admit reserves memory for sandboxes about to be made, each counted at its
// whole limit since it may grow to it, and refuses when the host would fall
// below the free-memory floor. The caller releases the reservation when the
// sandboxes exist (their memory then shows in MemAvailable); release is
// idempotent.
func (m *Manager) admit(mib int) (release func(), err error) {
	avail, err := memAvailableMiB()
	if err != nil {
		return func() {}, nil // no /proc/meminfo: no admission control
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if left := avail - m.reservedMiB - mib; left < m.cfg.MemoryFloorMiB {
		return nil, errdefs.New(errdefs.Unavailable,
			"not enough memory: this needs %d MiB (each sandbox counted at its whole memory limit), %d MiB are available and %d MiB must stay free (daemon flag --memory-floor); remove or sleep sandboxes, or ask for fewer or smaller ones",
			mib, avail-m.reservedMiB, m.cfg.MemoryFloorMiB)
	}
	m.reservedMiB += mib
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.reservedMiB -= mib
			m.mu.Unlock()
		})
	}, nil
}

func memAvailableMiB() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb >> 10, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// Sleep snapshots a running sandbox to disk and stops it; it keeps its id
// and uses no memory until Wake. Sleeping a sleeping sandbox is a no-op.
func (m *Manager) Sleep(ctx context.Context, ref string) (store.Sandbox, error) {
	snapper, err := m.snapshotter()
	if err != nil {
		return store.Sandbox{}, err
	}
	rec, unlock, err := m.lockSandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	switch rec.State {
	case store.StateSleeping:
		return rec, nil
	case store.StateRunning:
	default:
		return store.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a running sandbox can sleep", ref, rec.State)
	}
	ctx = context.WithoutCancel(ctx)
	dir := m.sleepDir(rec.ID)
	if err := os.RemoveAll(dir); err != nil {
		return store.Sandbox{}, err
	}
	if err := m.store.SetState(ctx, rec.ID, store.StateSuspending, ""); err != nil {
		return store.Sandbox{}, err
	}
	m.crashPoint("sleep-before-engine")
	if err := snapper.Checkpoint(ctx, rec.Engine(), dir, false); err != nil {
		return store.Sandbox{}, errors.Join(fmt.Errorf("sleep %s: %w", ref, err), os.RemoveAll(dir), m.store.SetState(ctx, rec.ID, store.StateRunning, ""))
	}
	if err := os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600); err != nil {
		return store.Sandbox{}, err
	}
	m.mu.Lock()
	delete(m.live, rec.ID)
	m.mu.Unlock()
	m.crashPoint("sleep-after-checkpoint")
	if err := errors.Join(m.eng.Destroy(ctx, rec.Engine()), m.afterStop(ctx, rec)); err != nil {
		m.log.Warn("sleep: cleanup failed; the next start retries", "sandbox", rec.ID, "err", err)
	}
	if err := m.store.SetState(ctx, rec.ID, store.StateSleeping, ""); err != nil {
		return store.Sandbox{}, err
	}
	rec.State = store.StateSleeping
	m.log.Info("sandbox asleep", "sandbox", rec.ID)
	return rec, nil
}

// completeMarker is written into a sleep image once the checkpoint finished.
const completeMarker = ".complete"

func (m *Manager) sleepDir(id string) string { return filepath.Join(m.cfg.SleepDir, id) }

// Wake restores a sleeping sandbox in place. Waking a running one is a no-op.
func (m *Manager) Wake(ctx context.Context, ref string) (store.Sandbox, error) {
	snapper, err := m.snapshotter()
	if err != nil {
		return store.Sandbox{}, err
	}
	rec, unlock, err := m.lockSandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	switch rec.State {
	case store.StateRunning:
		return rec, nil
	case store.StateSleeping:
	default:
		return store.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a sleeping sandbox can wake", ref, rec.State)
	}
	release, err := m.admit(rec.MemoryMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	img, err := m.images.Get(ctx, rec.Image)
	if err != nil {
		return store.Sandbox{}, err
	}
	ctx = context.WithoutCancel(ctx)
	// Wake into a prepared engine sandbox of the same shape when there is
	// one: the sandbox keeps its id, the engine's id may change.
	if engID, ok := m.pool.take(shapeOf(rec.Image, rec.MemoryMiB, rec.CPUs, rec.Env, rec.Opts.Network)); ok {
		if err := m.store.SetEngineID(ctx, rec.ID, engID); err != nil {
			return store.Sandbox{}, errors.Join(err, m.eng.Destroy(ctx, engID))
		}
		rec.EngineID = engID
	}
	defer m.pool.want(shapeOf(rec.Image, rec.MemoryMiB, rec.CPUs, rec.Env, rec.Opts.Network), 1, m.cfg.WarmPool)
	if err := m.store.SetState(ctx, rec.ID, store.StateWaking, ""); err != nil {
		return store.Sandbox{}, err
	}
	m.crashPoint("wake-before-engine")
	spec := m.spec(rec, img)
	var sb engine.Sandbox
	err = m.beforeStart(ctx, rec, &spec)
	if err == nil {
		sb, err = snapper.Restore(ctx, spec, m.sleepDir(rec.ID))
		if err == nil {
			if err = m.afterStart(ctx, rec, sb); err != nil {
				err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()))
			}
		}
		if err != nil {
			err = errors.Join(err, m.afterStop(ctx, rec))
		}
	}
	if err != nil {
		return store.Sandbox{}, errors.Join(fmt.Errorf("wake %s: %w", ref, err), m.store.SetState(ctx, rec.ID, store.StateSleeping, err.Error()))
	}
	if err := m.store.SetState(ctx, rec.ID, store.StateRunning, ""); err != nil {
		return store.Sandbox{}, err
	}
	m.track(rec.ID, sb)
	if err := os.RemoveAll(m.sleepDir(rec.ID)); err != nil {
		m.log.Warn("remove sleep image", "sandbox", rec.ID, "err", err)
	}
	rec.State = store.StateRunning
	m.log.Info("sandbox awake", "sandbox", rec.ID)
	return rec, nil
}

// reconcileSnapshots runs after the sandboxes are reconciled: half-taken
// snapshots and files nobody records go, implicit snapshots nobody uses go.
func (m *Manager) reconcileSnapshots(ctx context.Context) error {
	snaps, err := m.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	known := map[string]bool{}
	for _, sn := range snaps {
		_, statErr := os.Stat(sn.Path)
		if sn.State == store.SnapshotCreating || statErr != nil {
			m.log.Info("reconcile: removing incomplete snapshot", "snapshot", sn.ID, "state", sn.State)
			errs = append(errs, m.removeSnapshot(ctx, sn))
			continue
		}
		known[filepath.Base(sn.Path)] = true
		m.gcSnapshot(ctx, sn.ID)
	}
	errs = append(errs, removeUnknown(m.cfg.SnapshotDir, known))
	return errors.Join(errs...)
}

// removeUnknown deletes the entries of dir not in known.
func removeUnknown(dir string, known map[string]bool) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !known[e.Name()] {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
