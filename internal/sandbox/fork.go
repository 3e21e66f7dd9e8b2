package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/store"
)

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
	return m.fork(ctx, source, make([]store.Sandbox, n))
}

// fork fills in recs (names and ids may be preset: an import picks its
// children's ids before its fetch, see Porter.ImportAs) and restores them
// from source.
func (m *Manager) fork(ctx context.Context, source string, recs []store.Sandbox) (ForkResult, error) {
	snapper, err := snapshotterOf(m.eng)
	if err != nil {
		return ForkResult{}, err
	}
	if err := m.admission.checkDisk("fork"); err != nil {
		return ForkResult{}, err
	}
	sn, err := m.store.GetSnapshot(ctx, source)
	var resv *reservation
	implicit := false // sn is taken here, of a running sandbox
	if errdefs.IsNotFound(err) {
		parent, perr := m.store.GetSandbox(ctx, source)
		if errdefs.IsNotFound(perr) {
			return ForkResult{}, errdefs.New(errdefs.NotFound, "no snapshot or sandbox called %s (see `clade snapshot ls` and `clade ls`)", source)
		}
		if perr != nil {
			return ForkResult{}, perr
		}
		shared := m.admission.sharesFork(ctx, parent.Engine(), "")
		resv, err = m.admission.admitFork(len(recs), parent.MemoryMiB, shared)
		if err != nil {
			return ForkResult{}, err
		}
		if sn, err = m.Snapshot(ctx, parent.ID, "", true); err != nil {
			resv.release()
			return ForkResult{}, err
		}
		implicit = true
		if shared && !m.admission.sharesFork(ctx, "", sn.Path) {
			// The parent slept and woke between the admission and its
			// snapshot: its children load all of the image, so they count
			// whole.
			resv.release()
			if resv, err = m.admission.admitFork(len(recs), parent.MemoryMiB, false); err != nil {
				m.gcSnapshot(ctx, sn.ID)
				return ForkResult{}, err
			}
		}
	} else if err != nil {
		return ForkResult{}, err
	} else {
		if sn.State != store.SnapshotReady {
			return ForkResult{}, errdefs.New(errdefs.Conflict, "snapshot %s is still being taken", source)
		}
		if resv, err = m.admission.admitFork(len(recs), sn.MemoryMiB, m.admission.sharesFork(ctx, "", sn.Path)); err != nil {
			return ForkResult{}, err
		}
	}
	defer resv.release()
	// A snapshot this fork just took and sealed needs no second read of
	// its image (the checksums are ~0.6 s of a 512 MiB qemu VM's).
	if !implicit {
		if _, err := m.cfg.Copies.Restore(ctx, snapshotCopy(sn.ID), sn.Path); err != nil {
			return ForkResult{}, err
		}
		if err := verifySnapshotImage(sn.Path, "snapshot "+sn.ID); err != nil {
			return ForkResult{}, err
		}
	}
	// The image's root, or a root the image no longer names, or one
	// shipped from another node (the pools' sandboxes are made on the
	// image's current root: only its children take them).
	img, current, err := m.images.forRoot(ctx, sn.Image, sn.RootFS)
	if err != nil {
		return ForkResult{}, fmt.Errorf("image %s of snapshot %s: %w", sn.Image, sn.ID, err)
	}
	ctx = context.WithoutCancel(ctx) // children are made whole or not at all
	res := ForkResult{Snapshot: sn.ID, Children: make([]ForkChild, len(recs))}
	sh := shapeOf(sn.Image, sn.MemoryMiB, sn.CPUs, sn.Env, sn.Opts)
	if current {
		// Keep as many prepared for the next fork of this shape.
		defer m.pools.warm.Want(sh, len(recs))
	}
	// Children's locks first (lock order: sandboxes before snapshots); the
	// ids are new (an import's: nothing of them is on this node yet), so
	// nobody waits on them yet.
	unlocks := make([]func(), len(recs))
	for i := range recs {
		id := recs[i].ID
		if id == "" {
			var ok bool
			if id, ok = takeIf(current, m.pools.warm.Take, sh); !ok {
				id = newID()
			}
		}
		unlocks[i] = m.locks.lock(id)
		recs[i] = store.Sandbox{ID: id, Name: recs[i].Name, Image: sn.Image, State: store.StateCreating,
			MemoryMiB: sn.MemoryMiB, CPUs: sn.CPUs, Env: sn.Env, Snapshot: sn.ID, RootFS: sn.RootFS, Opts: freshOptions(childOptions(sn.Opts, recs[i].Opts), time.Now()), CreatedAt: time.Now()}
	}
	// The children are recorded as the snapshot's users under its lock, so
	// a removal of the snapshot cannot slip in between.
	unlockSnap := m.locks.lock(sn.ID)
	if _, err := m.store.GetSnapshot(ctx, sn.ID); err != nil {
		unlockSnap()
		for i := range recs {
			_ = m.pools.destroyPrepared(ctx, recs[i].ID) // a prepared sandbox from the pool, if any
			unlocks[i]()
		}
		return ForkResult{}, err
	}
	for i := range recs {
		if err := m.store.InsertSandbox(ctx, recs[i]); err != nil {
			res.Children[i].Err = err
			_ = m.pools.destroyPrepared(ctx, recs[i].ID)
			recs[i].ID = ""
			unlocks[i]()
			continue
		}
		m.events.emitRec(recs[i], events.Event{Type: events.Created, Snapshot: sn.ID})
	}
	unlockSnap()
	// The `creating` records count the children toward the cap from here:
	// the reservation holds only the floor's part.
	resv.recorded()
	sem := make(chan struct{}, m.cfg.RestoreParallel)
	var wg sync.WaitGroup
	live := make([]engine.Sandbox, len(recs))
	for i, rec := range recs {
		if rec.ID == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			live[i], res.Children[i] = m.restoreChildLocked(ctx, snapper, rec, specOf(rec, img), sn.Path)
		}()
	}
	wg.Wait()
	// The children stay `creating` until every restore is done: a daemon
	// killed before the answer leaves none the caller was not told of (the
	// restart removes half-done sandboxes).
	m.crash.hit("fork-after-children")
	var restored []string
	for i := range recs {
		if live[i] != nil {
			restored = append(restored, recs[i].ID)
		}
	}
	// One transaction: a kill leaves all of them creating or all running.
	moved := m.store.TransitionAll(ctx, restored, store.StateCreating, store.StateRunning)
	for i := range recs {
		if recs[i].ID == "" {
			continue
		}
		if live[i] != nil {
			res.Children[i] = m.finishChildLocked(ctx, recs[i], live[i], moved)
		}
		unlocks[i]()
	}
	forked := events.Event{Type: events.Forked, Snapshot: sn.ID}
	for _, c := range res.Children {
		if c.Err != nil {
			forked.Failed++
		} else {
			forked.Children = append(forked.Children, c.ID)
		}
	}
	m.events.emitID(sn.Sandbox, forked)
	m.gcSnapshot(ctx, sn.ID) // an implicit snapshot whose every child failed
	return res, nil
}

// restoreChildLocked restores one recorded child, which stays `creating`
// (finishChildLocked makes it running). Guarded by rec's lock.
func (m *Manager) restoreChildLocked(ctx context.Context, snapper engine.Snapshotter, rec store.Sandbox, spec engine.Spec, path string) (engine.Sandbox, ForkChild) {
	sb, err := m.startLocked(ctx, rec, spec, true, func(spec engine.Spec) (engine.Sandbox, error) {
		return snapper.Restore(ctx, spec, path)
	})
	if err != nil {
		return nil, ForkChild{Err: errors.Join(fmt.Errorf("restore child: %w", err), m.hooks.afterRemove(ctx, rec), m.deleteRecord(ctx, rec.ID))}
	}
	m.crash.hit("fork-mid-restore") // other children still restoring
	return sb, ForkChild{ID: rec.ID}
}

// finishChildLocked tracks a restored child that moved to running, or
// removes it if the move failed. Guarded by rec's lock.
func (m *Manager) finishChildLocked(ctx context.Context, rec store.Sandbox, sb engine.Sandbox, moved error) ForkChild {
	if moved != nil {
		err := errors.Join(moved, m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, rec))
		return ForkChild{Err: errors.Join(fmt.Errorf("restore child: %w", err), m.hooks.afterRemove(ctx, rec), m.deleteRecord(ctx, rec.ID))}
	}
	rec.State = store.StateRunning
	m.events.emitMove(rec, store.StateCreating, store.StateRunning, "")
	m.track(rec.ID, sb)
	return ForkChild{ID: rec.ID}
}

// childOptions are a restored sandbox's options: the snapshot's, with what
// the caller asked for this child (a template's sandbox brings its own
// network policy in the same mode, labels and lifetime).
func childOptions(sn, own store.Options) store.Options {
	o := sn
	if own.Network != nil {
		o.Network = own.Network
	}
	if own.Labels != nil {
		o.Labels = own.Labels
	}
	if own.Public {
		o.Public = true
	}
	if own.IdleSleepMS != 0 {
		o.IdleSleepMS = own.IdleSleepMS
	}
	if own.TimeoutMS != 0 {
		o.TimeoutMS, o.OnTimeout = own.TimeoutMS, own.OnTimeout
	}
	return o
}
