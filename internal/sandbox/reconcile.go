package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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

// reconciler settles, after a restart, what the store says with what the
// engine has (Manager.Reconcile), and keeps retrying the sandboxes that
// could not settle yet (a full disk, an agent that did not answer): it
// owns that retry set. It acts under each sandbox's lock, through the
// lifecycle for the moves and removals.
type reconciler struct {
	cfg     Config
	eng     engine.Engine
	store   store.All
	locks   *recordLocks
	hooks   hookChain
	traffic *Traffic
	images  *Images
	pools   *Pools
	log     *slog.Logger
	bg      context.Context // the service's: settling outlives Reconcile
	life    reconcileOps

	mu       sync.Mutex
	settling map[string]bool // guarded by mu: sandboxes a settle goroutine retries
}

// reconcileOps is what the reconciler needs of the lifecycle: state moves
// and removals of a sandbox whose lock it holds, a restore in place, the
// tracking of a reattached engine sandbox, and snapshot removal.
type reconcileOps interface {
	moveLocked(ctx context.Context, rec *store.Sandbox, to, msg string) error
	destroyLocked(ctx context.Context, rec store.Sandbox) error
	restoreInPlaceLocked(ctx context.Context, snapper engine.Snapshotter, rec store.Sandbox, dir string) (engine.Sandbox, error)
	track(id string, sb engine.Sandbox)
	removeSnapshot(ctx context.Context, sn store.Snapshot) error
	gcSnapshot(ctx context.Context, id string)
}

// Reconcile makes the engine and the store agree after a start: half-done
// creates are rolled back, half-done removals finished, sleeps and wakes cut
// short resumed from what is on disk, running sandboxes reattached, and
// prepared engine sandboxes nobody records destroyed. Started engine
// sandboxes the store does not know are kept (and logged) unless
// Config.DestroyUnrecorded: a lost database must not take them with it. A
// state image is deleted only when it is provably not needed.
func (m *Manager) Reconcile(ctx context.Context) error { return m.reconciler.run(ctx) }

// run is Reconcile.
func (r *reconciler) run(ctx context.Context) error {
	// The engine first: every engine sandbox made after this listing has
	// its record written before it, so it shows in the store's listing.
	engIDs, engErr := r.eng.List(ctx)
	recs, err := r.store.ListSandboxes(ctx)
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
			unlock := r.locks.lock(rec.ID)
			defer unlock()
			if rec, err := r.store.GetSandbox(ctx, rec.ID); err == nil {
				if rec.State == store.StateSleeping && inEngine[rec.Engine()] {
					// Asleep, so nothing of it runs: what the engine holds
					// under its engine id is a leftover, the prepared
					// sandbox a wake killed before it began had taken, or
					// one a sleep failed to destroy. The wake would find
					// the id taken.
					r.log.Info("reconcile: destroying the leftover engine sandbox of a sleeping sandbox", "sandbox", rec.ID, "engine_sandbox", rec.Engine())
					addErr(r.eng.Destroy(ctx, rec.Engine()))
				}
				err := r.reconcileLocked(ctx, rec, firstAttachWait)
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
	r.settleLater(unsettled)
	// Sleep images stay for every sandbox that may still need one: all but
	// the running (an unsettled one included: it may be asleep).
	keep := map[string]bool{}
	if recs, err := r.store.ListSandboxes(ctx); err == nil {
		for _, rec := range recs {
			if rec.State != store.StateRunning {
				keep[rec.ID] = true
			}
		}
	}
	addErr(removeUnknown(r.cfg.SleepDir, keep), r.reconcileSnapshots(ctx))
	r.images.gcRoots(ctx)
	addErr(r.reconcileHooks(ctx))
	if engErr != nil {
		return errors.Join(append(errs, engErr)...)
	}
	pooled, err := r.pools.reapPool(ctx, known)
	addErr(err)
	insp, _ := r.eng.(engine.Inspector)
	for _, id := range engIDs {
		if known[id] || pooled[id] {
			continue
		}
		if insp != nil && insp.Started(ctx, id) && !r.cfg.DestroyUnrecorded {
			r.log.Warn("reconcile: keeping a running engine sandbox the store does not record (was the database lost or replaced?); restart with --destroy-unrecorded to remove such sandboxes", "engine_sandbox", id)
			continue
		}
		r.log.Info("reconcile: destroying unrecorded engine sandbox", "engine_sandbox", id)
		addErr(r.eng.Destroy(ctx, id))
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
func (r *reconciler) settleLater(ids []string) {
	r.mu.Lock()
	var fresh []string
	for _, id := range ids {
		if !r.settling[id] {
			r.settling[id] = true
			fresh = append(fresh, id)
		}
	}
	r.mu.Unlock()
	if len(fresh) > 0 {
		go r.settle(r.bg, fresh)
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
func (r *reconciler) settle(ctx context.Context, ids []string) {
	r.log.Warn("reconcile: some sandboxes could not settle yet (a full disk, or an agent that did not answer in time); retrying until they do", "sandboxes", ids)
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	defer func() {
		r.mu.Lock()
		for _, id := range ids {
			delete(r.settling, id)
		}
		r.mu.Unlock()
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
				err := r.settleOne(ctx, id)
				switch {
				case worthRetry(err):
					lmu.Lock()
					left = append(left, id)
					lmu.Unlock()
				case err != nil && !errdefs.IsNotFound(err):
					r.log.Error("reconcile: settling a sandbox", "sandbox", id, "err", err)
				}
				if !worthRetry(err) {
					r.mu.Lock()
					delete(r.settling, id)
					r.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		ids = left
	}
}

// settleOne tries once more to settle sandbox id (see settle).
func (r *reconciler) settleOne(ctx context.Context, id string) error {
	unlock := r.locks.lock(id)
	rec, err := r.store.GetSandbox(ctx, id)
	if err != nil {
		unlock()
		return err
	}
	if rec.State == store.StateRunning && !r.traffic.isLive(id) && r.cutSnapshot(ctx, rec) == nil {
		unlock()
		return r.reattach(ctx, rec)
	}
	defer unlock()
	if inBetween(rec.State) || rec.State == store.StateRunning && !r.traffic.isLive(id) {
		// Nothing else runs on it (its lock is ours): the state is the
		// one the restart left.
		return r.reconcileLocked(ctx, rec, 0)
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
func (r *reconciler) reattach(ctx context.Context, rec store.Sandbox) error {
	sb, aerr := r.attach(ctx, rec)
	if worthRetry(aerr) {
		return aerr
	}
	unlock := r.locks.lock(rec.ID)
	defer unlock()
	cur, err := r.store.GetSandbox(ctx, rec.ID)
	if err != nil {
		return err
	}
	if cur.State != store.StateRunning || r.traffic.isLive(rec.ID) {
		return nil // settled meanwhile
	}
	if aerr != nil {
		return r.reconcileLocked(ctx, cur, 0)
	}
	r.life.track(rec.ID, sb)
	r.log.Info("reconcile: reattached", "sandbox", rec.ID)
	return nil
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
func (r *reconciler) reconcileLocked(ctx context.Context, rec store.Sandbox, wait time.Duration) error {
	switch rec.State {
	case store.StateCreating, store.StateDestroying:
		r.log.Info("reconcile: removing half-done sandbox", "sandbox", rec.ID, "state", rec.State)
		// Frees space, as a remove does: it may use the store's reserve.
		return r.life.destroyLocked(store.ForCleanup(ctx), rec)
	case store.StateSleeping:
		if _, err := os.Stat(r.cfg.sleepDir(rec.ID)); err != nil {
			if _, derr := r.cfg.Copies.Digest(sleepCopy(rec.ID)); derr == nil {
				return nil // in the snapshot store: the wake fetches it
			}
			return r.life.moveLocked(ctx, &rec, store.StateStopped, "its sleep image is missing")
		}
		if _, derr := r.cfg.Copies.Digest(sleepCopy(rec.ID)); errdefs.IsNotFound(derr) && r.cfg.Copies != nil && imageSealed(r.cfg.sleepDir(rec.ID)) {
			// A copy cut short by the daemon's end: made again.
			r.cfg.Copies.Put(sleepCopy(rec.ID), r.cfg.sleepDir(rec.ID))
		}
		return nil
	case store.StateSuspending:
		// A sleep cut short. A sealed image is whole: the sandbox is
		// asleep. Otherwise the engine kept the sandbox running (it stops
		// one only after its image is sealed): it runs on.
		if imageSealed(r.cfg.sleepDir(rec.ID)) {
			_ = r.eng.Destroy(ctx, rec.Engine())
			return errors.Join(r.hooks.afterStop(ctx, rec), r.life.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		sb, err := r.attachWithin(ctx, rec, wait)
		if worthRetry(err) {
			// It may well run (no room for its agent socket), or runs but
			// did not answer in time: settle retries. Destroying it would
			// lose the user's work, its unsealed image being of no use.
			return err
		}
		if err != nil {
			// Neither running nor provably asleep: keep what is on disk
			// for the operator and say so.
			_ = r.eng.Destroy(ctx, rec.Engine())
			r.log.Warn("reconcile: a sleep was cut short and the sandbox is gone; its unsealed image is kept", "sandbox", rec.ID, "dir", r.cfg.sleepDir(rec.ID), "err", err)
			return errors.Join(r.hooks.afterStop(ctx, rec), r.life.moveLocked(ctx, &rec, store.StateStopped,
				fmt.Sprintf("a sleep was cut short by a daemon restart and the sandbox did not survive; its unsealed image is kept in %s", r.cfg.sleepDir(rec.ID))))
		}
		if err := r.life.moveLocked(ctx, &rec, store.StateRunning, ""); err != nil {
			return err
		}
		r.life.track(rec.ID, sb)
		return os.RemoveAll(r.cfg.sleepDir(rec.ID))
	case store.StateWaking:
		sb, err := r.attach(ctx, rec)
		if errdefs.Is(err, errdefs.ResourceExhausted) {
			return err // it may well run: settle retries once there is room
		}
		if err != nil {
			// The wake did not finish: still asleep, its image intact.
			_ = r.eng.Destroy(ctx, rec.Engine())
			return errors.Join(r.hooks.afterStop(ctx, rec), r.life.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		if err := startFresh(ctx, sb, r.cfg.sleepDir(rec.ID)); err != nil {
			// Restored but not started afresh: asleep again, as above.
			_ = r.eng.Destroy(ctx, rec.Engine())
			return errors.Join(err, r.hooks.afterStop(ctx, rec), r.life.moveLocked(ctx, &rec, store.StateSleeping, ""))
		}
		if err := r.life.moveLocked(ctx, &rec, store.StateRunning, ""); err != nil {
			return err
		}
		r.life.track(rec.ID, sb)
		return os.RemoveAll(r.cfg.sleepDir(rec.ID))
	case store.StateRunning:
		cut := r.cutSnapshot(ctx, rec)
		if cut != nil && imageSealed(cut.Path) {
			// Sealed after the engine stopped rec for the snapshot's
			// copy: rec runs only if the daemon died after restoring it
			// (a moment). A short look keeps that run; otherwise it is
			// restored from the checkpoint.
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			sb, err := r.attach(actx, rec)
			cancel()
			if err == nil {
				r.life.track(rec.ID, sb)
				r.log.Info("reconcile: reattached a sandbox restored after its snapshot", "sandbox", rec.ID)
				return r.removeCutSnapshot(ctx, *cut)
			}
			_ = r.eng.Destroy(ctx, rec.Engine())
			return r.reconcileCutSnapshotLocked(ctx, rec, *cut)
		}
		sb, err := r.attachWithin(ctx, rec, wait)
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
				return errors.Join(err, r.removeCutSnapshot(ctx, *cut))
			}
			return err
		}
		if err != nil {
			_ = r.eng.Destroy(ctx, rec.Engine())
			if cut != nil {
				return r.reconcileCutSnapshotLocked(ctx, rec, *cut)
			}
			r.log.Warn("reconcile: sandbox is gone", "sandbox", rec.ID, "err", err)
			return errors.Join(r.hooks.afterStop(ctx, rec), r.life.moveLocked(ctx, &rec, store.StateStopped, err.Error()))
		}
		r.life.track(rec.ID, sb)
		r.log.Info("reconcile: reattached", "sandbox", rec.ID)
	}
	return nil
}

// cutSnapshot returns the snapshot of rec a restart cut short, if any,
// when it is of the kind that stops rec (snapshotStoppedLocked); a
// snapshot that leaves rec running has nothing to undo.
func (r *reconciler) cutSnapshot(ctx context.Context, rec store.Sandbox) *store.Snapshot {
	if _, stop := r.hooks.snapshotOptions(rec); !stop {
		return nil
	}
	snaps, err := r.store.ListSnapshots(ctx)
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
func (r *reconciler) reconcileCutSnapshotLocked(ctx context.Context, rec store.Sandbox, sn store.Snapshot) error {
	snapper, err := snapshotterOf(r.eng)
	if err != nil {
		return err
	}
	// What the last run held (mounts, a slot) goes; the restore takes it
	// again, as a wake does.
	if err := r.hooks.afterStop(ctx, rec); err != nil {
		r.log.Warn("reconcile: releasing a stopped sandbox's resources", "sandbox", rec.ID, "err", err)
	}
	why := ""
	if !imageSealed(sn.Path) {
		why = "its checkpoint was never sealed"
	} else if verr := verifySnapshotImage(sn.Path, "the checkpoint of snapshot "+sn.ID); verr != nil {
		why = verr.Error()
	} else {
		sb, rerr := r.life.restoreInPlaceLocked(ctx, snapper, rec, sn.Path)
		if rerr == nil {
			r.life.track(rec.ID, sb)
			r.log.Info("reconcile: a snapshot had stopped the sandbox when the daemon died; restored it in place from the snapshot's checkpoint", "sandbox", rec.ID, "snapshot", sn.ID)
			return r.removeCutSnapshot(ctx, sn)
		}
		if errdefs.Is(rerr, errdefs.ResourceExhausted) {
			return rerr // settle retries once there is room
		}
		why = "its restore failed: " + rerr.Error()
	}
	r.log.Warn("reconcile: a snapshot had stopped the sandbox when the daemon died and it cannot be restored; it is stopped, its volumes intact", "sandbox", rec.ID, "snapshot", sn.ID, "reason", why)
	if err := r.life.moveLocked(ctx, &rec, store.StateStopped, fmt.Sprintf(
		"a daemon restart cut short snapshot %s, which had stopped this sandbox, and %s: its processes are gone; its volumes are intact (mount them in a new sandbox)", sn.ID, why)); err != nil {
		return err
	}
	return r.removeCutSnapshot(ctx, sn)
}

// removeCutSnapshot removes a snapshot a restart cut short, under its
// lock (taken after its sandbox's, the lock order).
func (r *reconciler) removeCutSnapshot(ctx context.Context, sn store.Snapshot) error {
	unlock := r.locks.lock(sn.ID)
	defer unlock()
	r.log.Info("reconcile: removing incomplete snapshot", "snapshot", sn.ID, "state", sn.State)
	return r.life.removeSnapshot(ctx, sn)
}

// attach reconnects to rec's engine sandbox. Whatever fails once ctx has
// ended (the daemon stops while it reconciles) is Unavailable: it says
// nothing of the sandbox, which callers must not destroy for it.
func (r *reconciler) attach(ctx context.Context, rec store.Sandbox) (engine.Sandbox, error) {
	img, _, err := r.images.forRoot(ctx, rec.Image, rec.RootFS)
	if err != nil && rec.RootFS == "" {
		return nil, unavailableIfEnded(ctx, err)
	}
	sb, err := r.eng.Attach(ctx, specOf(rec, img))
	return sb, unavailableIfEnded(ctx, err)
}

// attachWithin is attach bounded by wait, if not zero; an attach that
// runs out of it is Unavailable.
func (r *reconciler) attachWithin(ctx context.Context, rec store.Sandbox, wait time.Duration) (engine.Sandbox, error) {
	if wait <= 0 {
		return r.attach(ctx, rec)
	}
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return r.attach(actx, rec)
}

// unavailableIfEnded classes err Unavailable when ctx has ended.
func unavailableIfEnded(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errdefs.IsUnavailable(err) {
		return errdefs.Wrap(errdefs.Unavailable, err)
	}
	return err
}

func (r *reconciler) reconcileHooks(ctx context.Context) error {
	all, err := r.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	var running []store.Sandbox
	for _, rec := range all {
		if rec.State == store.StateRunning {
			running = append(running, rec)
		}
	}
	return r.hooks.reconcile(ctx, running, all)
}

// reconcileSnapshots runs after the sandboxes are reconciled: half-taken
// snapshots and files nobody records go, implicit snapshots nobody uses go.
func (r *reconciler) reconcileSnapshots(ctx context.Context) error {
	snaps, err := r.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	known := map[string]bool{}
	r.mu.Lock()
	settling := maps.Clone(r.settling)
	r.mu.Unlock()
	for _, sn := range snaps {
		_, statErr := os.Stat(sn.Path)
		if sn.State == store.SnapshotCreating && settling[sn.Sandbox] {
			// Its sandbox may yet be restored from it once the disk
			// has room (reconcileCutSnapshotLocked removes it then).
			known[filepath.Base(sn.Path)] = true
			continue
		}
		_, copyErr := r.cfg.Copies.Digest(snapshotCopy(sn.ID))
		if sn.State == store.SnapshotReady && statErr != nil && copyErr == nil {
			// Only in the snapshot store: a fork fetches it.
			continue
		}
		if sn.State == store.SnapshotCreating || statErr != nil {
			r.log.Info("reconcile: removing incomplete snapshot", "snapshot", sn.ID, "state", sn.State)
			errs = append(errs, r.life.removeSnapshot(ctx, sn))
			continue
		}
		if r.cfg.Copies != nil && !sn.Implicit && errdefs.IsNotFound(copyErr) {
			// A copy cut short by the daemon's end: made again.
			r.cfg.Copies.Put(snapshotCopy(sn.ID), sn.Path)
		}
		known[filepath.Base(sn.Path)] = true
		r.life.gcSnapshot(ctx, sn.ID)
	}
	errs = append(errs, removeUnknown(r.cfg.SnapshotDir, known))
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
