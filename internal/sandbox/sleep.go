package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/clade-sandbox/clade/internal/steps"
	"github.com/clade-sandbox/clade/internal/store"
)

// Sleep snapshots a running sandbox to disk and stops it; it keeps its id
// and uses no memory until Wake. Sleeping a sleeping sandbox is a no-op. A
// failed sleep leaves the sandbox running.
func (m *Manager) Sleep(ctx context.Context, ref string) (store.Sandbox, error) {
	snapper, err := snapshotterOf(m.eng)
	if err != nil {
		return store.Sandbox{}, err
	}
	rec, unlock, err := m.locks.sandbox(ctx, ref)
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
	if err := m.admission.checkDisk("sleep"); err != nil {
		return store.Sandbox{}, err
	}
	_, err = m.sleepLocked(context.WithoutCancel(ctx), snapper, &rec, asAsked)
	return rec, err
}

// sleepRaceHook, set by tests only, is called by sleepLocked for an idle
// sleep: with "idle" once the sleeper's first look found the sandbox idle,
// and with "retired" once the sandbox is out of service, before its
// checkpoint.
var sleepRaceHook func(point, id string)

// asAsked is sleepLocked's quiet for a sleep that was asked for (Sleep,
// a timeout): it does not wait for the sandbox to be idle, and calls in
// flight on it fail.
const asAsked time.Duration = -1

// sleepLocked puts rec to sleep: as asked (quiet is asAsked), or only if
// it is idle for quiet (the sleepers of idle sandboxes: the idle sleep,
// memory pressure, a drain). For those, whether it is idle and its leaving
// service are one step (Traffic.retire): a call that found it live first
// makes it busy, one that comes after waits for the sleep and wakes it.
// busy says why it stays ("" when it slept). Guarded by rec's lock.
func (m *Manager) sleepLocked(ctx context.Context, snapper engine.Snapshotter, rec *store.Sandbox, quiet time.Duration) (busy string, err error) {
	var sb engine.Sandbox
	if quiet == asAsked {
		// Requests that come now wait for the lock, then wake the
		// sandbox; so do those that looked it up before but open their
		// call only now (refused unstarted). Calls open are cut.
		sb, _ = m.traffic.retire(rec.ID, asAsked)
	} else {
		if sleepRaceHook != nil {
			sleepRaceHook("idle", rec.ID)
		}
		if sb, busy = m.traffic.retire(rec.ID, quiet); busy != "" {
			return busy, nil
		}
		if sleepRaceHook != nil {
			sleepRaceHook("retired", rec.ID)
		}
	}
	if err := os.RemoveAll(m.cfg.sleepDir(rec.ID)); err != nil {
		m.traffic.relive(rec.ID, sb)
		return "", err
	}
	st := steps.New(m.log)
	defer st.Log(m.log, "sleep timings", "sandbox", rec.ID)
	dir := m.cfg.sleepDir(rec.ID)
	if err := m.moveLocked(ctx, rec, store.StateSuspending, ""); err != nil {
		m.traffic.relive(rec.ID, sb)
		return "", err
	}
	st.Mark("suspending")
	m.crash.hit("sleep-before-engine")
	// Sealed before the engine stops the sandbox: a daemon killed at any
	// moment leaves it running or asleep, never gone with an unsealed image.
	// The identity of the root it stands on, for a node that adopts it
	// ("" if the root is this node's only: it then wakes only here).
	root, rerr := m.images.rootIdentity(ctx, rec.Image, rec.RootFS)
	if rerr != nil {
		m.log.Info("a sleeping sandbox's root is this node's only: it wakes only here", "sandbox", rec.ID, "why", rerr)
	}
	seal := func() error {
		m.crash.hit("sleep-before-seal")
		if err := markFresh(ctx, dir); err != nil {
			return err
		}
		// The image describes its sandbox: another node can wake it
		// from the image alone (adopt.go).
		if err := writeSandboxFile(dir, *rec, root); err != nil {
			return err
		}
		return sealImage(dir)
	}
	err = snapper.Checkpoint(engine.WithSeal(ctx, seal), rec.Engine(), dir, false)
	st.Mark("checkpoint")
	if err != nil {
		// The engine leaves a sandbox whose checkpoint failed running.
		m.traffic.relive(rec.ID, sb)
		return "", errors.Join(fmt.Errorf("sleep %s: %w", rec.ID, err), os.RemoveAll(dir), m.rollbackLocked(ctx, rec, store.StateRunning))
	}
	sealed := time.Now()
	m.crash.hit("sleep-after-checkpoint")
	if len(rec.Opts.Volumes) > 0 {
		// Volumes are unmounted before the record says asleep: a wake
		// mounts them again by the sandbox's id, whatever its engine id.
		if err := errors.Join(m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, *rec)); err != nil {
			m.log.Warn("sleep: cleanup failed; the next start retries", "sandbox", rec.ID, "err", err)
		}
		st.Mark("cleanup")
	}
	err = m.moveLocked(ctx, rec, store.StateSleeping, "")
	st.Mark("sleeping")
	if len(rec.Opts.Volumes) == 0 {
		m.crash.hit("sleep-before-reap")
		m.reaper.reapLater(*rec)
	}
	if err != nil {
		return "", err
	}
	go preverify(m.bg, dir, sealed)
	m.cfg.Copies.Put(sleepCopy(rec.ID), dir)
	m.pools.prepareForSleepers(ctx, *rec)
	m.log.Info("sandbox asleep", "sandbox", rec.ID)
	return "", nil
}

// preverify checks a new sleep image in the background once its files
// are old enough for stateimg to remember the check (preverifyAfter after
// the seal, which wrote them last): the
// wake that comes later then finds it verified and does not read the
// whole image on the request's path. A wake before that verifies it
// itself; an image woken (and removed) meanwhile is an error nobody needs.
func preverify(bg context.Context, dir string, sealed time.Time) {
	select {
	case <-bg.Done():
		return
	case <-time.After(time.Until(sealed.Add(preverifyAfter))):
	}
	_ = verifySleepImage(dir, "the sleep image "+dir)
}

// preverifyAfter is how long after its seal a sleep image is checked:
// stateimg's settle time (100 ms) and a margin.
const preverifyAfter = 120 * time.Millisecond

// sleepDir is where sandbox id's sleep image is kept.
func (c Config) sleepDir(id string) string { return filepath.Join(c.SleepDir, id) }

// sleepCopy and snapshotCopy name the copies of a sleep image and of a
// snapshot in the snapshot store (Config.Copies).
func sleepCopy(id string) string    { return "sleep/" + id }
func snapshotCopy(id string) string { return "snapshot/" + id }

// Wake restores a sleeping sandbox in place. Waking a running one is a no-op.
// A failed wake leaves the sandbox asleep, its image intact.
func (m *Manager) Wake(ctx context.Context, ref string) (store.Sandbox, error) {
	rec, unlock, err := m.locks.sandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	if err := m.wakeLocked(ctx, &rec); err != nil {
		return store.Sandbox{}, err
	}
	return rec, nil
}

// wakeLocked wakes rec. Guarded by rec's lock.
func (m *Manager) wakeLocked(ctx context.Context, rec *store.Sandbox) error {
	snapper, err := snapshotterOf(m.eng)
	if err != nil {
		return err
	}
	switch rec.State {
	case store.StateRunning:
		return nil
	case store.StateSleeping:
	default:
		return errdefs.New(errdefs.Conflict, "sandbox %s is %s: only a sleeping sandbox can wake", rec.ID, rec.State)
	}
	t0 := time.Now()
	dir := m.cfg.sleepDir(rec.ID)
	// A sleep image this host no longer holds (a lost disk, a move) comes
	// back from the snapshot store, verified, before it is verified here.
	if _, err := m.cfg.Copies.Restore(ctx, sleepCopy(rec.ID), dir); err != nil {
		return err
	}
	if err := verifySleepImage(dir, "the sleep image of sandbox "+rec.ID); err != nil {
		return err
	}
	tv := time.Now()
	resv, err := m.admission.admit(rec.MemoryMiB)
	if err != nil {
		return err
	}
	defer resv.release()
	ta := time.Now()
	// Restores at once beyond a few per core only share the CPU and the
	// memory bandwidth: every one of them ends late. Queued, the first
	// wakes of a mass wake end early (20 slept apps on 2 cores: see
	// docs/benchmarks.md, masswake).
	select {
	case m.wakes <- struct{}{}:
		defer func() { <-m.wakes }()
	case <-ctx.Done():
		return ctx.Err()
	}
	t1 := time.Now()
	img, current, err := m.images.forRoot(ctx, rec.Image, rec.RootFS)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	// Wake into a prepared engine sandbox of the same shape when there is
	// one: the sandbox keeps its id, the engine's id may change.
	// Only on the image's current root (the pools' sandboxes stand on it).
	sh := shapeOf(rec.Image, rec.MemoryMiB, rec.CPUs, rec.Env, rec.Opts)
	if engID, ok := takeIf(current, m.pools.warm.Take, sh); ok {
		if err := m.store.SetEngineID(ctx, rec.ID, engID); err != nil {
			return errors.Join(err, m.pools.destroyPrepared(ctx, engID))
		}
		rec.EngineID = engID
		m.crash.hit("wake-after-engine-id")
	}
	if current {
		defer m.pools.warm.Want(sh, 1)
	}
	if err := m.moveLocked(ctx, rec, store.StateWaking, ""); err != nil {
		return err
	}
	resv.recorded() // a waking record counts toward the cap
	m.crash.hit("wake-before-engine")
	t2 := time.Now()
	sb, err := m.startLocked(ctx, *rec, specOf(*rec, img), true, func(spec engine.Spec) (engine.Sandbox, error) {
		return snapper.Restore(ctx, spec, dir)
	})
	t3 := time.Now()
	if err == nil {
		m.crash.hit("wake-before-fresh")
		if err = startFresh(ctx, sb, dir); err != nil {
			err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, *rec))
		} else if err = m.moveLocked(ctx, rec, store.StateRunning, ""); err != nil {
			err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, *rec))
		}
	}
	if err != nil {
		back := m.moveLocked(ctx, rec, store.StateSleeping, err.Error())
		if errdefs.Is(back, errdefs.ResourceExhausted) {
			// Still recorded waking, its image intact: settled (asleep)
			// once the disk has room.
			m.reconciler.settleLater([]string{rec.ID})
		}
		return errors.Join(fmt.Errorf("wake %s: %w", rec.ID, err), back)
	}
	m.track(rec.ID, sb)
	m.traffic.woke(rec.ID)
	m.counters.Wakes.Add(1)
	m.lifetimes.rearmLocked(ctx, rec)
	if err := m.cfg.Copies.Drop(sleepCopy(rec.ID)); err != nil {
		m.log.Warn("snapshot store: drop the copy of a woken sandbox's sleep image", "sandbox", rec.ID, "err", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		m.log.Warn("remove sleep image", "sandbox", rec.ID, "err", err)
	}
	m.log.Info("sandbox awake", "sandbox", rec.ID)
	m.log.Debug("wake", "sandbox", rec.ID, "verify", tv.Sub(t0), "admit", ta.Sub(tv), "queue", t1.Sub(ta), "record", t2.Sub(t1), "start", t3.Sub(t2), "after", time.Since(t3))
	return nil
}

// completeMarker marked a whole sleep image before images were sealed
// with a manifest (stateimg); such images are trusted unverified.
const completeMarker = ".complete"

// sealImage marks a state image written by a checkpoint as whole; only a
// sealed image is ever restored, or trusted after a restart.
func sealImage(dir string) error { return stateimg.Seal(dir) }

// imageSealed reports whether a state image was finished.
func imageSealed(dir string) bool {
	if stateimg.Sealed(dir) {
		return true
	}
	_, err := os.Stat(filepath.Join(dir, completeMarker))
	return err == nil
}

// verifySleepImage checks a sleep image before a wake.
func verifySleepImage(dir, what string) error {
	if stateimg.Sealed(dir) {
		return stateimg.VerifyAs(dir, what)
	}
	if imageSealed(dir) {
		return nil // an older daemon's image
	}
	return errdefs.New(errdefs.Conflict, "%s is incomplete or missing: it was never sealed", what)
}

// verifySnapshotImage checks a snapshot's image before a fork. The store
// holds only snapshots whose checkpoint finished; one taken before images
// were sealed has no manifest and is trusted as it was.
func verifySnapshotImage(dir, what string) error {
	if stateimg.Sealed(dir) {
		return stateimg.VerifyAs(dir, what)
	}
	return nil
}
