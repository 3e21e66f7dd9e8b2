package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/store"
)

// shape is what a prepared sandbox has to match to be used: the engine made
// its container with these resources and this environment.
type shape struct {
	image     string
	memoryMiB int
	cpus      float64
	env       string
	// network is the network mode: a prepared sandbox is made in its
	// network (runsc takes it at create).
	network string
}

func shapeOf(image string, memoryMiB int, cpus float64, env []string, network *store.NetworkOptions) shape {
	sh := shape{image: image, memoryMiB: memoryMiB, cpus: cpus, env: strings.Join(env, "\x00")}
	if network != nil {
		sh.network = network.Mode
	}
	return sh
}

// warmPool keeps prepared sandboxes (created, not started) per shape, so a
// create only starts one and a fork only restores into them: the slow half
// of making a sandbox (sandbox and gofer processes, seccomp filters) runs
// ahead of time, one at a time, off the hot path.
type warmPool struct {
	mu     sync.Mutex
	slots  map[shape][]string
	target map[shape]int
	specs  map[string]engine.Spec
	kick   chan struct{}
}

func newWarmPool() *warmPool {
	return &warmPool{slots: map[shape][]string{}, target: map[shape]int{}, specs: map[string]engine.Spec{}, kick: make(chan struct{}, 1)}
}

// take returns a prepared sandbox id of shape sh, if there is one.
func (p *warmPool) take(sh shape) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.slots[sh]
	if len(ids) == 0 {
		return "", false
	}
	id := ids[len(ids)-1]
	p.slots[sh] = ids[:len(ids)-1]
	delete(p.specs, id)
	return id, true
}

// want asks for n prepared sandboxes of shape sh (at most limit).
func (p *warmPool) want(sh shape, n, limit int) {
	p.mu.Lock()
	p.target[sh] = max(p.target[sh], min(n, limit))
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// missing returns a shape that has fewer prepared sandboxes than wanted.
func (p *warmPool) missing() (shape, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for sh, n := range p.target {
		if len(p.slots[sh]) < n {
			return sh, true
		}
	}
	return shape{}, false
}

// StartPool keeps the warm pool filled until ctx ends. Call it after
// Reconcile, which destroys engine sandboxes it has no record of.
func (m *Manager) StartPool(ctx context.Context) {
	prep, ok := m.eng.(engine.Preparer)
	if !ok || m.cfg.WarmPool <= 0 {
		return
	}
	def := CreateRequest{}
	if err := m.validate(&def); err == nil {
		m.pool.want(shapeOf(def.Image, def.MemoryMiB, def.CPUs, nil, def.Network), m.cfg.WarmCreate, m.cfg.WarmPool)
	}
	go func() {
		for {
			sh, ok := m.pool.missing()
			if !ok {
				select {
				case <-ctx.Done():
					return
				case <-m.pool.kick:
					continue
				}
			}
			if err := m.prepareOne(ctx, prep, sh); err != nil {
				if ctx.Err() != nil {
					return
				}
				m.log.Warn("warm pool: prepare failed", "err", err)
				select { // do not spin on a persistent failure
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Second):
				}
			}
		}
	}()
}

func (m *Manager) prepareOne(ctx context.Context, prep engine.Preparer, sh shape) error {
	// A prepared sandbox holds ~30 MiB: never at the cost of the floor.
	release, err := m.admit(64)
	if err != nil {
		return err
	}
	defer release()
	img, err := m.images.Get(ctx, sh.image)
	if err != nil {
		return err
	}
	id := newID()
	var env []string
	if sh.env != "" {
		env = strings.Split(sh.env, "\x00")
	}
	rec := store.Sandbox{ID: id, MemoryMiB: sh.memoryMiB, CPUs: sh.cpus, Env: env}
	if sh.network != "" {
		rec.Opts.Network = &store.NetworkOptions{Mode: sh.network, Egress: "deny"}
	}
	spec := m.spec(rec, img)
	// The hooks set it up as for a start (e.g. its network slot, which
	// the start it is taken for keeps, with that sandbox's policy).
	if err := m.beforeStart(ctx, rec, &spec); err != nil {
		return err
	}
	if err := prep.Prepare(ctx, spec); err != nil {
		return errors.Join(err, m.afterStop(ctx, rec))
	}
	m.pool.mu.Lock()
	m.pool.slots[sh] = append(m.pool.slots[sh], id)
	m.pool.specs[id] = spec
	m.pool.mu.Unlock()
	return nil
}

// drainPool destroys the prepared sandboxes nobody took.
func (m *Manager) drainPool(ctx context.Context) {
	m.pool.mu.Lock()
	var ids []string
	for _, s := range m.pool.slots {
		ids = append(ids, s...)
	}
	m.pool.slots = map[shape][]string{}
	m.pool.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		_ = m.eng.Destroy(ctx, id)
		_ = m.afterStop(ctx, store.Sandbox{ID: id})
	}
}

// Warm returns how many prepared sandboxes wait in the pool.
func (m *Manager) Warm() int {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(m.pool.specs)
}
