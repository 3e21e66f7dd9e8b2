package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/steps"
	"github.com/clade-sandbox/clade/internal/store"
)

// snapshotterOf is eng's Snapshotter, or why it has none.
func snapshotterOf(eng engine.Engine) (engine.Snapshotter, error) {
	s, ok := eng.(engine.Snapshotter)
	if !ok {
		return nil, errdefs.New(errdefs.InvalidArgument, "the %s engine cannot snapshot", eng.Name())
	}
	return s, nil
}

// Snapshot freezes a running sandbox into a new snapshot; the sandbox keeps
// running. Implicit snapshots (made by a fork of a sandbox) are removed with
// their last child.
func (m *Manager) Snapshot(ctx context.Context, ref, name string, implicit bool) (store.Snapshot, error) {
	snapper, err := snapshotterOf(m.eng)
	if err != nil {
		return store.Snapshot{}, err
	}
	if name != "" {
		if err := validName("snapshot", name); err != nil {
			return store.Snapshot{}, err
		}
	}
	st := steps.New(m.log)
	if err := m.admission.checkDisk("snapshot"); err != nil {
		return store.Snapshot{}, err
	}
	rec, unlock, err := m.locks.sandbox(ctx, ref)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer unlock()
	if rec.State == store.StateSleeping {
		return store.Snapshot{}, errdefs.New(errdefs.Conflict, "sandbox %s is sleeping: only a running sandbox can be snapshotted or forked; wake it first (`clade wake %s`)", ref, ref)
	}
	if rec.State != store.StateRunning {
		return store.Snapshot{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a running sandbox can be snapshotted", ref, rec.State)
	}
	id := newID()
	opts, stop := m.hooks.snapshotOptions(rec)
	sn := store.Snapshot{ID: id, Name: name, Sandbox: rec.ID, Image: rec.Image, State: store.SnapshotCreating,
		MemoryMiB: rec.MemoryMiB, CPUs: rec.CPUs, Env: rec.Env, Path: filepath.Join(m.cfg.SnapshotDir, id), Implicit: implicit,
		RootFS: rec.RootFS, Opts: opts, CreatedAt: time.Now()}
	st.Mark("lock")
	if err := m.store.InsertSnapshot(ctx, sn); err != nil {
		return store.Snapshot{}, err
	}
	st.Mark("insert")
	ctx = context.WithoutCancel(ctx)
	m.crash.hit("snapshot-before-engine")
	fail := func(err error) (store.Snapshot, error) {
		return store.Snapshot{}, errors.Join(fmt.Errorf("snapshot %s: %w", ref, err), os.RemoveAll(sn.Path), m.hooks.snapshotRemoved(ctx, sn), m.store.DeleteSnapshot(ctx, id))
	}
	if stop {
		if err := m.snapshotStoppedLocked(ctx, snapper, rec, sn); err != nil {
			return fail(err)
		}
	} else {
		if err := snapper.Checkpoint(ctx, rec.Engine(), sn.Path, true); err != nil {
			return fail(err)
		}
		st.Mark("checkpoint")
		if err := sealImage(sn.Path); err != nil {
			return fail(err)
		}
		st.Mark("seal")
	}
	m.crash.hit("snapshot-before-ready")
	sn.SizeBytes = image.DirSize(sn.Path)
	if err := m.store.SetSnapshotReady(ctx, id, sn.SizeBytes); err != nil {
		return store.Snapshot{}, err
	}
	st.Mark("ready")
	defer st.Log(m.log, "snapshot timings", "snapshot", id)
	sn.State = store.SnapshotReady
	if !implicit {
		// Implicit snapshots (a fork's) live only as long as the fork.
		m.cfg.Copies.Put(snapshotCopy(id), sn.Path)
	}
	m.events.emitRec(rec, events.Event{Type: events.Snapshotted, Snapshot: id})
	m.log.Info("snapshot taken", "snapshot", id, "sandbox", rec.ID, "size_mib", sn.SizeBytes>>20)
	return sn, nil
}

// snapshotStoppedLocked snapshots rec with state outside the checkpoint
// (volumes): the checkpoint stops rec's engine sandbox, the hooks copy
// their state while nothing runs, and rec is restored in place from the
// new image, as a wake would. A failed restore leaves rec stopped with
// the reason. Guarded by rec's lock.
func (m *Manager) snapshotStoppedLocked(ctx context.Context, snapper engine.Snapshotter, rec store.Sandbox, sn store.Snapshot) error {
	// Requests that come now wait for the lock and find rec running again.
	sb := m.traffic.drop(rec.ID)
	// Sealed before the engine stops the sandbox (a daemon killed before
	// the seal leaves it running; see snapshot-before-seal).
	seal := func() error {
		m.crash.hit("snapshot-before-seal")
		return sealImage(sn.Path)
	}
	if err := snapper.Checkpoint(engine.WithSeal(ctx, seal), rec.Engine(), sn.Path, false); err != nil {
		m.traffic.relive(rec.ID, sb) // the engine leaves it running
		return err
	}
	// From here to the restore, rec is recorded running but its engine
	// sandbox is stopped: a restart restores it in place from the sealed
	// image (reconcileCutSnapshotLocked).
	m.crash.hit("snapshot-stopped")
	err := m.hooks.snapshotTaken(ctx, rec, sn)
	if derr := errors.Join(m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, rec)); derr != nil {
		m.log.Warn("snapshot: cleanup failed; the restart retries", "sandbox", rec.ID, "err", derr)
	}
	m.crash.hit("snapshot-before-restore")
	nsb, rerr := m.restoreInPlaceLocked(ctx, snapper, rec, sn.Path)
	if rerr != nil {
		return errors.Join(err, rerr, m.moveLocked(ctx, &rec, store.StateStopped, "restart after snapshot: "+rerr.Error()))
	}
	m.track(rec.ID, nsb)
	return err
}

// restoreInPlaceLocked starts rec's engine sandbox again from the
// checkpoint in dir, keeping its id, volumes and network slot. Guarded by
// rec's lock.
func (m *Manager) restoreInPlaceLocked(ctx context.Context, snapper engine.Snapshotter, rec store.Sandbox, dir string) (engine.Sandbox, error) {
	img, _, err := m.images.forRoot(ctx, rec.Image, rec.RootFS)
	if err != nil && rec.RootFS == "" {
		return nil, err
	}
	return m.startLocked(ctx, rec, specOf(rec, img), true, func(spec engine.Spec) (engine.Sandbox, error) {
		return snapper.Restore(ctx, spec, dir)
	})
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
	sn, unlock, err := m.locks.snapshot(ctx, ref)
	if err != nil {
		return err
	}
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
	if m.pins.held(sn.ID) {
		return errdefs.New(errdefs.Conflict, "snapshot %s is being sent to other nodes for a fork across nodes: try again when the fork is done", ref)
	}
	return m.removeSnapshot(store.ForCleanup(context.WithoutCancel(ctx)), sn)
}

// removeSnapshot deletes a snapshot's files and record. Guarded by the
// snapshot's lock, or run where nobody else can know it.
func (m *Manager) removeSnapshot(ctx context.Context, sn store.Snapshot) error {
	if err := errors.Join(m.cfg.Copies.Drop(snapshotCopy(sn.ID)), os.RemoveAll(sn.Path)); err != nil {
		return err
	}
	if err := m.hooks.snapshotRemoved(ctx, sn); err != nil {
		return err
	}
	if err := m.store.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	m.log.Info("snapshot removed", "snapshot", sn.ID)
	m.images.gcStaleRoot(ctx, sn.Image, sn.RootFS)
	return nil
}

// gcSnapshot removes an implicit snapshot once no sandbox uses it.
func (m *Manager) gcSnapshot(ctx context.Context, id string) {
	if id == "" || m.pins.held(id) {
		return // a fork across nodes still sends it (its release collects it)
	}
	unlock := m.locks.lock(id)
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
