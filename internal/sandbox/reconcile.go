package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// Reconcile makes the engine and the store agree after a start: half-done
// creates are rolled back, half-done removals finished, sleeps and wakes cut
// short resumed from what is on disk, running sandboxes reattached, and
// prepared engine sandboxes nobody records destroyed. Started engine
// sandboxes the store does not know are kept (and logged) unless
// Config.DestroyUnrecorded: a lost database must not take them with it. A
// state image is deleted only when it is provably not needed.
func (m *Manager) Reconcile(ctx context.Context) error {
	// The engine first: every engine sandbox made after this listing has
	// its record written before it, so it shows in the store's listing.
	engIDs, engErr := m.eng.List(ctx)
	recs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	var (
		errs []error
		emu  sync.Mutex
		wg   sync.WaitGroup
	)
	addErr := func(e ...error) {
		emu.Lock()
		errs = append(errs, e...)
		emu.Unlock()
	}
	known := map[string]bool{}
	inEngine := map[string]bool{}
	for _, id := range engIDs {
		inEngine[id] = true
	}
	var unsettled []string // could not record their outcome: a full disk
	// Bounded: each attach starts a runsc process (~20 ms of CPU) and
	// then mostly waits for the agent's next dial.
	sem := make(chan struct{}, reconcileParallel())
	for _, rec := range recs {
		known[rec.Engine()] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			unlock := m.locks.lock(rec.ID)
			defer unlock()
			if rec, err := m.store.GetSandbox(ctx, rec.ID); err == nil {
				if rec.State == store.StateSleeping && inEngine[rec.Engine()] {
					// Asleep, so nothing of it runs: what the engine holds
					// under its engine id is a leftover, the prepared
					// sandbox a wake killed before it began had taken, or
					// one a sleep failed to destroy. The wake would find
					// the id taken.
					m.log.Info("reconcile: destroying the leftover engine sandbox of a sleeping sandbox", "sandbox", rec.ID, "engine_sandbox", rec.Engine())
					addErr(m.eng.Destroy(ctx, rec.Engine()))
				}
				err := m.reconcileLocked(ctx, rec, firstAttachWait)
				if worthRetry(err) {
					emu.Lock()
					unsettled = append(unsettled, rec.ID)
					emu.Unlock()
				}
				addErr(err)
			}
		}()
	}
	wg.Wait()
	// Under the service's context, not the caller's (a start-up timeout):
	// settling outlives Reconcile.
	m.settleLater(unsettled)
	// Sleep images stay for every sandbox that may still need one: all but
	// the running (an unsettled one included: it may be asleep).
	keep := map[string]bool{}
	if recs, err := m.store.ListSandboxes(ctx); err == nil {
		for _, rec := range recs {
			if rec.State != store.StateRunning {
				keep[rec.ID] = true
			}
		}
	}
	addErr(removeUnknown(m.cfg.SleepDir, keep), m.reconcileSnapshots(ctx))
	m.gcRoots(ctx)
	addErr(m.reconcileHooks(ctx))
	if engErr != nil {
		return errors.Join(append(errs, engErr)...)
	}
	pooled, err := m.reapPool(ctx, known)
	addErr(err)
	insp, _ := m.eng.(engine.Inspector)
	for _, id := range engIDs {
		if known[id] || pooled[id] {
			continue
		}
		if insp != nil && insp.Started(ctx, id) && !m.cfg.DestroyUnrecorded {
			m.log.Warn("reconcile: keeping a running engine sandbox the store does not record (was the database lost or replaced?); restart with --destroy-unrecorded to remove such sandboxes", "engine_sandbox", id)
			continue
		}
		m.log.Info("reconcile: destroying unrecorded engine sandbox", "engine_sandbox", id)
		addErr(m.eng.Destroy(ctx, id))
	}
	return errors.Join(errs...)
}

// reconcileParallel is how many sandboxes Reconcile settles at once.
func reconcileParallel() int { return max(16, 4*runtime.NumCPU()) }

// firstAttachWait bounds Reconcile's attach of a running sandbox (and of
// one whose sleep was cut short), which the daemon's API waits for. A
// healthy agent redials within 250 ms; one that does not answer in this
// long (a frozen agent, `kill -STOP 1` inside; a host too loaded) is
// left to settle, which waits for it in the background, its lock free.
// The engine's own wait (30 s) per batch of reconcileParallel used to hold
// the API that long for every frozen agent.
var firstAttachWait = 5 * time.Second

// settleLater starts settle, under the service's context, for those of
// ids no settle retries yet. It may be called with a sandbox's lock held
// (deleteRecord), and from settle itself (through destroyLocked): one
// retry loop per sandbox, however often its settling fails.
func (m *Manager) settleLater(ids []string) {
	m.mu.Lock()
	var fresh []string
	for _, id := range ids {
		if !m.settling[id] {
			m.settling[id] = true
			fresh = append(fresh, id)
		}
	}
	m.mu.Unlock()
	if len(fresh) > 0 {
		go m.settle(m.bg, fresh)
	}
}

// worthRetry says whether a reconcile that failed with err is worth
// retrying: a full disk kept it from recording its outcome (ResourceExhausted),
// or a running sandbox's agent did not answer in time (Unavailable).
func worthRetry(err error) bool {
	return errdefs.Is(err, errdefs.ResourceExhausted) || errdefs.IsUnavailable(err)
}

// settle retries the reconcile of sandboxes that could not settle: a full
// disk kept the store from recording their outcome (they show a state in
// between, e.g. waking) or their agent socket from fitting, or a running
// one's agent did not answer in time. It retries until they settle or ctx
// ends. Start it with settleLater.
func (m *Manager) settle(ctx context.Context, ids []string) {
	m.log.Warn("reconcile: some sandboxes could not settle yet (a full disk, or an agent that did not answer in time); retrying until they do", "sandboxes", ids)
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	defer func() {
		m.mu.Lock()
		for _, id := range ids {
			delete(m.settling, id)
		}
		m.mu.Unlock()
	}()
	for len(ids) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var (
			left []string
			lmu  sync.Mutex
			wg   sync.WaitGroup
		)
		// At once: one sandbox whose agent does not answer must not keep
		// the others waiting for its attach to give up.
		sem := make(chan struct{}, reconcileParallel())
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				err := m.settleOne(ctx, id)
				switch {
				case worthRetry(err):
					lmu.Lock()
					left = append(left, id)
					lmu.Unlock()
				case err != nil && !errdefs.IsNotFound(err):
					m.log.Error("reconcile: settling a sandbox", "sandbox", id, "err", err)
				}
				if !worthRetry(err) {
					m.mu.Lock()
					delete(m.settling, id)
					m.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		ids = left
	}
}

// settleOne tries once more to settle sandbox id (see settle).
func (m *Manager) settleOne(ctx context.Context, id string) error {
	unlock := m.locks.lock(id)
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		unlock()
		return err
	}
	if rec.State == store.StateRunning && !m.isLive(id) && m.cutSnapshot(ctx, rec) == nil {
		unlock()
		return m.reattach(ctx, rec)
	}
	defer unlock()
	if inBetween(rec.State) || rec.State == store.StateRunning && !m.isLive(id) {
		// Nothing else runs on it (its lock is ours): the state is the
		// one the restart left.
		return m.reconcileLocked(ctx, rec, 0)
	}
	return nil
}

// reattach attaches a running sandbox a restart could not reach, without
// its lock: the attach may wait long for an agent that does not answer (a
// frozen one), and requests to the sandbox must meanwhile get their
// "retry" at once, and a removal go ahead. Its lock is taken for the
// outcome: the attach is kept only if the sandbox is still running and
// unattached (a removal meanwhile destroyed the engine sandbox, ending
// the attach); a failure other than a retryable one is settled by
// reconcileLocked as at a restart.
func (m *Manager) reattach(ctx context.Context, rec store.Sandbox) error {
	sb, aerr := m.attach(ctx, rec)
	if worthRetry(aerr) {
		return aerr
	}
	unlock := m.locks.lock(rec.ID)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, rec.ID)
	if err != nil {
		return err
	}
	if cur.State != store.StateRunning || m.isLive(rec.ID) {
		return nil // settled meanwhile
	}
	if aerr != nil {
		return m.reconcileLocked(ctx, cur, 0)
	}
	m.track(rec.ID, sb)
	m.log.Info("reconcile: reattached", "sandbox", rec.ID)
	return nil
}

// isLive says whether sandbox id has a live engine sandbox.
func (m *Manager) isLive(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, live := m.live[id]
	return live
}

// inBetween says whether a sandbox in state is mid-way between two others.
func inBetween(state string) bool {
	switch state {
	case store.StateCreating, store.StateDestroying, store.StateSuspending, store.StateWaking:
		return true
	}
	return false
}

// reconcileLocked settles one sandbox after a restart. wait, if not zero,
// bounds the attach of a sandbox that may run on (running, or a sleep cut
// short): one that does not answer in that long is Unavailable, for
// settle to retry. Guarded by rec's lock.
func (m *Manager) reconcileLocked(ctx context.Context, rec store.Sandbox, wait time.Duration) error {
	switch rec.State {
	case store.StateCreating, store.StateDestroying:
		m.log.Info("reconcile: removing half-done sandbox", "sandbox", rec.ID, "state", rec.State)
		// Frees space, as a remove does: it may use the store's reserve.
		return m.destroyLocked(store.ForCleanup(ctx), rec)
	case store.StateSleeping:
		if _, err := os.Stat(m.sleepDir(rec.ID)); err != nil {
			if _, derr := m.cfg.Copies.Digest(sleepCopy(rec.ID)); derr == nil {
				return nil // in the snapshot store: the wake fetches it
			}
			return m.moveLocked(ctx, &rec, store.StateStopped, "its sleep image is missing")
		}
		if _, derr := m.cfg.Copies.Digest(sleepCopy(rec.ID)); errdefs.IsNotFound(derr) && m.cfg.Copies != nil && imageSealed(m.sleepDir(rec.ID)) {
			// A copy cut short by the daemon's end: made again.
			m.cfg.Copies.Put(sleepCopy(rec.ID), m.sleepDir(rec.ID))
		}
		return nil
	case store.StateSuspending:
		// A sleep cut short. A sealed image is whole: the sandbox is
		// asleep. Otherwise the engine kept the sandbox running (it stops
		// one only after its image is sealed): it runs on.
		if imageSealed(m.sleepDir(rec.ID)) {
			_ = m.eng.Destroy(ctx, rec.Engine())
			return errors.Join(m.afterStop(ctx, rec), m.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		sb, err := m.attachWithin(ctx, rec, wait)
		if worthRetry(err) {
			// It may well run (no room for its agent socket), or runs but
			// did not answer in time: settle retries. Destroying it would
			// lose the user's work, its unsealed image being of no use.
			return err
		}
		if err != nil {
			// Neither running nor provably asleep: keep what is on disk
			// for the operator and say so.
			_ = m.eng.Destroy(ctx, rec.Engine())
			m.log.Warn("reconcile: a sleep was cut short and the sandbox is gone; its unsealed image is kept", "sandbox", rec.ID, "dir", m.sleepDir(rec.ID), "err", err)
			return errors.Join(m.afterStop(ctx, rec), m.moveLocked(ctx, &rec, store.StateStopped,
				fmt.Sprintf("a sleep was cut short by a daemon restart and the sandbox did not survive; its unsealed image is kept in %s", m.sleepDir(rec.ID))))
		}
		if err := m.moveLocked(ctx, &rec, store.StateRunning, ""); err != nil {
			return err
		}
		m.track(rec.ID, sb)
		return os.RemoveAll(m.sleepDir(rec.ID))
	case store.StateWaking:
		sb, err := m.attach(ctx, rec)
		if errdefs.Is(err, errdefs.ResourceExhausted) {
			return err // it may well run: settle retries once there is room
		}
		if err != nil {
			// The wake did not finish: still asleep, its image intact.
			_ = m.eng.Destroy(ctx, rec.Engine())
			return errors.Join(m.afterStop(ctx, rec), m.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		if err := m.startFresh(ctx, sb, m.sleepDir(rec.ID)); err != nil {
			// Restored but not started afresh: asleep again, as above.
			_ = m.eng.Destroy(ctx, rec.Engine())
			return errors.Join(err, m.afterStop(ctx, rec), m.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		if err := m.moveLocked(ctx, &rec, store.StateRunning, ""); err != nil {
			return err
		}
		m.track(rec.ID, sb)
		return os.RemoveAll(m.sleepDir(rec.ID))
	case store.StateRunning:
		cut := m.cutSnapshot(ctx, rec)
		if cut != nil && imageSealed(cut.Path) {
			// Sealed after the engine stopped rec for the snapshot's
			// copy: rec runs only if the daemon died after restoring it
			// (a moment). A short look keeps that run; otherwise it is
			// restored from the checkpoint.
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			sb, err := m.attach(actx, rec)
			cancel()
			if err == nil {
				m.track(rec.ID, sb)
				m.log.Info("reconcile: reattached a sandbox restored after its snapshot", "sandbox", rec.ID)
				return m.removeCutSnapshot(ctx, *cut)
			}
			_ = m.eng.Destroy(ctx, rec.Engine())
			return m.reconcileCutSnapshotLocked(ctx, rec, *cut)
		}
		sb, err := m.attachWithin(ctx, rec, wait)
		if errdefs.Is(err, errdefs.ResourceExhausted) {
			return err // it may well run: settle retries once there is room
		}
		if errdefs.IsUnavailable(err) {
			// It runs, but its agent did not answer in time (a loaded
			// host, a frozen sandbox, a shutdown under way): it stays
			// running and unattached (requests get "retry"), and settle
			// tries again. Destroying it would lose the user's work. A
			// snapshot cut short before its seal left it running too
			// (the engine stops it only once the image is sealed): that
			// half-made snapshot is of no use, and goes.
			if cut != nil {
				return errors.Join(err, m.removeCutSnapshot(ctx, *cut))
			}
			return err
		}
		if err != nil {
			_ = m.eng.Destroy(ctx, rec.Engine())
			if cut != nil {
				return m.reconcileCutSnapshotLocked(ctx, rec, *cut)
			}
			m.log.Warn("reconcile: sandbox is gone", "sandbox", rec.ID, "err", err)
			return errors.Join(m.afterStop(ctx, rec), m.moveLocked(ctx, &rec, store.StateStopped, err.Error()))
		}
		m.track(rec.ID, sb)
		m.log.Info("reconcile: reattached", "sandbox", rec.ID)
	}
	return nil
}

// cutSnapshot returns the snapshot of rec a restart cut short, if any,
// when it is of the kind that stops rec (snapshotStoppedLocked); a
// snapshot that leaves rec running has nothing to undo.
func (m *Manager) cutSnapshot(ctx context.Context, rec store.Sandbox) *store.Snapshot {
	if _, stop := m.snapshotOptions(rec); !stop {
		return nil
	}
	snaps, err := m.store.ListSnapshots(ctx)
	if err != nil {
		return nil
	}
	for _, sn := range snaps {
		if sn.Sandbox == rec.ID && sn.State == store.SnapshotCreating {
			return &sn
		}
	}
	return nil
}

// reconcileCutSnapshotLocked settles a running sandbox whose engine
// sandbox is gone because snapshot sn stopped it (one with volumes is
// stopped for the copy) and the daemon died before restoring it. A sealed
// checkpoint is whole and the volumes are as it left them (nothing ran
// since): rec is restored in place from it, its processes and volumes
// intact. An unsealed one cannot be trusted: rec is stopped, saying so;
// its volumes are intact. Either way the half-made snapshot goes. Guarded
// by rec's lock; rec's engine sandbox is destroyed.
func (m *Manager) reconcileCutSnapshotLocked(ctx context.Context, rec store.Sandbox, sn store.Snapshot) error {
	snapper, err := m.snapshotter()
	if err != nil {
		return err
	}
	// What the last run held (mounts, a slot) goes; the restore takes it
	// again, as a wake does.
	if err := m.afterStop(ctx, rec); err != nil {
		m.log.Warn("reconcile: releasing a stopped sandbox's resources", "sandbox", rec.ID, "err", err)
	}
	why := ""
	if !imageSealed(sn.Path) {
		why = "its checkpoint was never sealed"
	} else if verr := verifySnapshotImage(sn.Path, "the checkpoint of snapshot "+sn.ID); verr != nil {
		why = verr.Error()
	} else {
		sb, rerr := m.restoreInPlaceLocked(ctx, snapper, rec, sn.Path)
		if rerr == nil {
			m.track(rec.ID, sb)
			m.log.Info("reconcile: a snapshot had stopped the sandbox when the daemon died; restored it in place from the snapshot's checkpoint", "sandbox", rec.ID, "snapshot", sn.ID)
			return m.removeCutSnapshot(ctx, sn)
		}
		if errdefs.Is(rerr, errdefs.ResourceExhausted) {
			return rerr // settle retries once there is room
		}
		why = "its restore failed: " + rerr.Error()
	}
	m.log.Warn("reconcile: a snapshot had stopped the sandbox when the daemon died and it cannot be restored; it is stopped, its volumes intact", "sandbox", rec.ID, "snapshot", sn.ID, "reason", why)
	if err := m.moveLocked(ctx, &rec, store.StateStopped, fmt.Sprintf(
		"a daemon restart cut short snapshot %s, which had stopped this sandbox, and %s: its processes are gone; its volumes are intact (mount them in a new sandbox)", sn.ID, why)); err != nil {
		return err
	}
	return m.removeCutSnapshot(ctx, sn)
}

// removeCutSnapshot removes a snapshot a restart cut short, under its
// lock (taken after its sandbox's, the lock order).
func (m *Manager) removeCutSnapshot(ctx context.Context, sn store.Snapshot) error {
	unlock := m.locks.lock(sn.ID)
	defer unlock()
	m.log.Info("reconcile: removing incomplete snapshot", "snapshot", sn.ID, "state", sn.State)
	return m.removeSnapshot(ctx, sn)
}

// attach reconnects to rec's engine sandbox. Whatever fails once ctx has
// ended (the daemon stops while it reconciles) is Unavailable: it says
// nothing of the sandbox, which callers must not destroy for it.
func (m *Manager) attach(ctx context.Context, rec store.Sandbox) (engine.Sandbox, error) {
	img, err := m.images.Get(ctx, rec.Image)
	if err != nil && rec.RootFS == "" {
		return nil, unavailableIfEnded(ctx, err)
	}
	sb, err := m.eng.Attach(ctx, m.spec(rec, img))
	return sb, unavailableIfEnded(ctx, err)
}

// attachWithin is attach bounded by wait, if not zero; an attach that
// runs out of it is Unavailable.
func (m *Manager) attachWithin(ctx context.Context, rec store.Sandbox, wait time.Duration) (engine.Sandbox, error) {
	if wait <= 0 {
		return m.attach(ctx, rec)
	}
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return m.attach(actx, rec)
}

// unavailableIfEnded classes err Unavailable when ctx has ended.
func unavailableIfEnded(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errdefs.IsUnavailable(err) {
		return errdefs.Wrap(errdefs.Unavailable, err)
	}
	return err
}

func (m *Manager) reconcileHooks(ctx context.Context) error {
	all, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	var running []store.Sandbox
	for _, rec := range all {
		if rec.State == store.StateRunning {
			running = append(running, rec)
		}
	}
	var errs []error
	for _, h := range m.cfg.Hooks {
		if err := h.Reconcile(ctx, running, all); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
		}
	}
	return errors.Join(errs...)
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
	m.mu.Lock()
	settling := maps.Clone(m.settling)
	m.mu.Unlock()
	for _, sn := range snaps {
		_, statErr := os.Stat(sn.Path)
		if sn.State == store.SnapshotCreating && settling[sn.Sandbox] {
			// Its sandbox may yet be restored from it once the disk
			// has room (reconcileCutSnapshotLocked removes it then).
			known[filepath.Base(sn.Path)] = true
			continue
		}
		_, copyErr := m.cfg.Copies.Digest(snapshotCopy(sn.ID))
		if sn.State == store.SnapshotReady && statErr != nil && copyErr == nil {
			// Only in the snapshot store: a fork fetches it.
			continue
		}
		if sn.State == store.SnapshotCreating || statErr != nil {
			m.log.Info("reconcile: removing incomplete snapshot", "snapshot", sn.ID, "state", sn.State)
			errs = append(errs, m.removeSnapshot(ctx, sn))
			continue
		}
		if m.cfg.Copies != nil && !sn.Implicit && errdefs.IsNotFound(copyErr) {
			// A copy cut short by the daemon's end: made again.
			m.cfg.Copies.Put(snapshotCopy(sn.ID), sn.Path)
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
