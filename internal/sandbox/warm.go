package sandbox

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/sandbox/pool"
	"github.com/clade-sandbox/clade/internal/store"
)

// StartPool keeps the warm pool filled until ctx ends. Call it after
// Reconcile, which destroys prepared engine sandboxes it has no record of.
func (m *Manager) StartPool(ctx context.Context) {
	def := CreateRequest{}
	if err := m.validate(&def); err != nil {
		return
	}
	sh := shapeOf(def.Image, def.MemoryMiB, def.CPUs, nil, def.Opts)
	if _, ok := m.eng.(engine.Preparer); ok && m.cfg.WarmPool > 0 {
		m.pool.Pin(sh, m.cfg.WarmCreate)
		go m.pool.Run(ctx)
	}
	if m.cfg.hotPinned() > 0 {
		if m.cfg.HotPool > 0 {
			m.hotPool.Pin(sh, m.cfg.HotPool)
		}
		for _, name := range slices.Sorted(maps.Keys(m.cfg.HotImages)) {
			n := m.cfg.HotImages[name]
			if n <= 0 {
				continue
			}
			// The shape a plain create of that image has: all the
			// defaults but the image.
			req := CreateRequest{Image: name}
			if err := m.validate(&req); err != nil {
				m.log.Warn("hot pool: not keeping sandboxes of an image", "image", name, "err", err)
				continue
			}
			m.hotPool.Pin(shapeOf(req.Image, req.MemoryMiB, req.CPUs, nil, req.Opts), n)
		}
		go m.hotPool.Run(ctx)
	}
}

// prepare makes one prepared engine sandbox of shape sh for the pool.
func (m *Manager) prepare(ctx context.Context, sh pool.Shape) (string, error) {
	prep := m.eng.(engine.Preparer)
	m.yieldToWakes(ctx)
	if err := m.admission.nearPressure("warm pool", 64); err != nil {
		return "", err
	}
	// A prepared sandbox holds ~30 MiB: never at the cost of the floor.
	resv, err := m.admission.admit(64)
	if err != nil {
		return "", err
	}
	defer resv.release()
	img, err := m.images.Get(ctx, sh.Image)
	if err != nil {
		return "", err
	}
	rec := store.Sandbox{ID: newID(), MemoryMiB: sh.MemoryMiB, CPUs: sh.CPUs, Env: sh.EnvList(), Opts: store.Options{DiskMiB: sh.DiskMiB, Engine: sh.Engine}}
	if sh.Network != "" {
		// Slotted with the policy most sandboxes have (see poolNetwork);
		// a taker with another policy gets it applied by the start it is
		// taken for, before anything of it runs.
		nw, err := m.hooks.poolNetwork(sh)
		if err != nil {
			return "", err
		}
		rec.Opts.Network = nw
	}
	spec := specOf(rec, img)
	// The hooks set it up as for a start (e.g. its network slot: runsc
	// takes the network namespace when it creates the container).
	if err := m.hooks.beforeStart(ctx, rec, &spec); err != nil {
		return "", err
	}
	if err := prep.Prepare(ctx, spec); err != nil {
		return "", errors.Join(err, m.hooks.afterStop(ctx, rec))
	}
	return rec.ID, nil
}

// yieldToWakes holds a prepare back while wakes restore (for at most
// yieldMax): on a few cores a prepare (~0.1 s of CPU) beside a mass wake's
// restores only makes every one of them end later; the pool refills once
// they are done (docs/benchmarks.md, masswake).
func (m *Manager) yieldToWakes(ctx context.Context) {
	deadline := time.Now().Add(yieldMax)
	for len(m.wakes) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(yieldPoll):
		}
	}
}

const (
	yieldMax  = 5 * time.Second
	yieldPoll = 10 * time.Millisecond
)

// Warm returns how many prepared sandboxes wait in the pool.
func (m *Manager) Warm() int { return m.pool.Len() }

// Hot returns how many started sandboxes wait in the hot pool.
func (m *Manager) Hot() int { return m.hotPool.Len() }

// PoolStats returns how many creates, forks and wakes found a prepared
// sandbox of their shape in the pool, and how many did not.
func (m *Manager) PoolStats() (hits, misses int64) { return m.pool.Stats() }

// HotPoolStats returns how many creates claimed a started sandbox from the
// hot pool, and how many found none of their shape.
func (m *Manager) HotPoolStats() (hits, misses int64) { return m.hotPool.Stats() }

// destroyPrepared removes a prepared sandbox nobody took, and what the
// hooks set up for it.
func (m *Manager) destroyPrepared(ctx context.Context, id string) error {
	return errors.Join(m.eng.Destroy(ctx, id), m.hooks.afterStop(ctx, store.Sandbox{ID: id}))
}
