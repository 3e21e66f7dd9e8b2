package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/sandbox/pool"
	"github.com/clade-sandbox/clade/internal/store"
)

// Pools are the warm pool (prepared engine sandboxes: created, not
// started) and the hot pool (started sandboxes, their agent connected,
// record-less until a create claims one; hot.go): their bookkeeping is
// package pool's, the engine sandboxes and the hot ones' handles are
// theirs here.
type Pools struct {
	cfg       Config
	eng       engine.Engine
	marks     store.Pool      // the hot sandboxes' marks; a claim records and unmarks at once
	recs      store.Sandboxes // the sleeping sandboxes prepareForSleepers counts
	images    *Images
	admission *admission
	hooks     hookChain
	events    *eventLog
	crash     crashPoints
	log       *slog.Logger
	life      poolOps
	// wakes holds a token per wake restoring now (the lifecycle's): a
	// prepare yields to them.
	wakes chan struct{}

	warm    *pool.Pool // prepared engine sandboxes, by shape
	hotPool *pool.Pool // started sandboxes, by shape

	mu  sync.Mutex
	hot map[string]hotSandbox // guarded by mu: the started sandboxes in hotPool, by id
}

// poolOps is what the pools need of the lifecycle: a start run with the
// hooks around it, and a create request's defaults (the pinned shapes).
type poolOps interface {
	startLocked(ctx context.Context, rec store.Sandbox, spec engine.Spec, reconf bool, start func(engine.Spec) (engine.Sandbox, error)) (engine.Sandbox, error)
	validate(req *CreateRequest) error
}

func newPools(p *Pools) *Pools {
	p.hot = map[string]hotSandbox{}
	p.warm = pool.New(pool.Config{Limit: p.cfg.WarmPool, Prepare: p.prepare, Destroy: p.destroyPrepared, Log: p.log})
	// The default shape keeps HotPool started, each of HotImages its
	// count; shapes learned from demand (one each, see hot.go) share
	// HotPool more.
	hotMax := p.cfg.HotPool
	for _, n := range p.cfg.HotImages {
		hotMax = max(hotMax, n)
	}
	p.hotPool = pool.New(pool.Config{Limit: hotMax, MaxTotal: p.cfg.hotPinned() + p.cfg.HotPool, Defer: hotRefillDefer, Prepare: p.startHot, Destroy: p.destroyHot, Log: p.log})
	return p
}

// drain destroys the pools' sandboxes.
func (p *Pools) drain(ctx context.Context) {
	p.warm.Drain(ctx)
	p.hotPool.Drain(ctx)
}

// flush gives back every pooled sandbox (memory is short) and returns
// how many.
func (p *Pools) flush(ctx context.Context) int { return p.flushHot(ctx) + p.warm.Flush(ctx) }

// flushImage gives back the pools' sandboxes of image name (its root was
// replaced); the refills make new ones on the new root.
func (p *Pools) flushImage(ctx context.Context, name string) {
	ofImage := func(sh pool.Shape) bool { return sh.Image == name }
	p.hotPool.FlushIf(ctx, ofImage)
	p.warm.FlushIf(ctx, ofImage)
}

// prepareForSleepers asks the warm pool for one prepared sandbox for each
// sleeping sandbox of rec's shape (up to the pool's limit per shape): a
// burst of wakes (a mass wake through the ingress) then restores into
// prepared sandboxes, not into ones it makes first on the same cores.
// Each prepared sandbox costs ~30 MiB while it waits (docs/benchmarks.md,
// masswake).
func (p *Pools) prepareForSleepers(ctx context.Context, rec store.Sandbox) {
	recs, err := p.recs.ListSandboxes(ctx)
	if err != nil {
		return
	}
	sh := shapeOf(rec.Image, rec.MemoryMiB, rec.CPUs, rec.Env, rec.Opts)
	n := 0
	for _, r := range recs {
		if r.State == store.StateSleeping && shapeOf(r.Image, r.MemoryMiB, r.CPUs, r.Env, r.Opts) == sh {
			n++
		}
	}
	p.warm.Want(sh, n)
}

// Start keeps the pools filled until ctx ends. Call it after
// Reconcile, which destroys prepared engine sandboxes it has no record of.
func (p *Pools) Start(ctx context.Context) {
	def := CreateRequest{}
	if err := p.life.validate(&def); err != nil {
		return
	}
	sh := shapeOf(def.Image, def.MemoryMiB, def.CPUs, nil, def.Opts)
	if _, ok := p.eng.(engine.Preparer); ok && p.cfg.WarmPool > 0 {
		p.warm.Pin(sh, p.cfg.WarmCreate)
		go p.warm.Run(ctx)
	}
	if p.cfg.hotPinned() > 0 {
		if p.cfg.HotPool > 0 {
			p.hotPool.Pin(sh, p.cfg.HotPool)
		}
		for _, name := range slices.Sorted(maps.Keys(p.cfg.HotImages)) {
			n := p.cfg.HotImages[name]
			if n <= 0 {
				continue
			}
			// The shape a plain create of that image has: all the
			// defaults but the image.
			req := CreateRequest{Image: name}
			if err := p.life.validate(&req); err != nil {
				p.log.Warn("hot pool: not keeping sandboxes of an image", "image", name, "err", err)
				continue
			}
			p.hotPool.Pin(shapeOf(req.Image, req.MemoryMiB, req.CPUs, nil, req.Opts), n)
		}
		go p.hotPool.Run(ctx)
	}
}

// prepare makes one prepared engine sandbox of shape sh for the pool.
func (p *Pools) prepare(ctx context.Context, sh pool.Shape) (string, error) {
	prep := p.eng.(engine.Preparer)
	p.yieldToWakes(ctx)
	if err := p.admission.nearPressure("warm pool", 64); err != nil {
		return "", err
	}
	// A prepared sandbox holds ~30 MiB: never at the cost of the floor.
	resv, err := p.admission.admit(64)
	if err != nil {
		return "", err
	}
	defer resv.release()
	img, err := p.images.Get(ctx, sh.Image)
	if err != nil {
		return "", err
	}
	rec := store.Sandbox{ID: newID(), MemoryMiB: sh.MemoryMiB, CPUs: sh.CPUs, Env: sh.EnvList(), Opts: store.Options{DiskMiB: sh.DiskMiB, Engine: sh.Engine}}
	if sh.Network != "" {
		// Slotted with the policy most sandboxes have (see poolNetwork);
		// a taker with another policy gets it applied by the start it is
		// taken for, before anything of it runs.
		nw, err := p.hooks.poolNetwork(sh)
		if err != nil {
			return "", err
		}
		rec.Opts.Network = nw
	}
	spec := specOf(rec, img)
	// The hooks set it up as for a start (e.g. its network slot: runsc
	// takes the network namespace when it creates the container).
	if err := p.hooks.beforeStart(ctx, rec, &spec); err != nil {
		return "", err
	}
	if err := prep.Prepare(ctx, spec); err != nil {
		return "", errors.Join(err, p.hooks.afterStop(ctx, rec))
	}
	return rec.ID, nil
}

// yieldToWakes holds a prepare back while wakes restore (for at most
// yieldMax): on a few cores a prepare (~0.1 s of CPU) beside a mass wake's
// restores only makes every one of them end later; the pool refills once
// they are done (docs/benchmarks.md, masswake).
func (p *Pools) yieldToWakes(ctx context.Context) {
	deadline := time.Now().Add(yieldMax)
	for len(p.wakes) > 0 && time.Now().Before(deadline) {
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
func (p *Pools) Warm() int { return p.warm.Len() }

// Hot returns how many started sandboxes wait in the hot pool.
func (p *Pools) Hot() int { return p.hotPool.Len() }

// WarmStats returns how many creates, forks and wakes found a prepared
// sandbox of their shape in the pool, and how many did not.
func (p *Pools) WarmStats() (hits, misses int64) { return p.warm.Stats() }

// HotStats returns how many creates claimed a started sandbox from the
// hot pool, and how many found none of their shape.
func (p *Pools) HotStats() (hits, misses int64) { return p.hotPool.Stats() }

// destroyPrepared removes a prepared sandbox nobody took, and what the
// hooks set up for it.
func (p *Pools) destroyPrepared(ctx context.Context, id string) error {
	return errors.Join(p.eng.Destroy(ctx, id), p.hooks.afterStop(ctx, store.Sandbox{ID: id}))
}
