// Package multi serves several engines side by side behind one
// engine.Engine: each sandbox runs in the engine its Spec.Engine names (the
// default one when empty). The lifecycle service drives it like any other
// engine; calls that name only an id (Destroy, Checkpoint) go to the engine
// that holds it.
package multi

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// CheckpointOwner is an engine that recognises its own checkpoint
// directories; Restore sends a directory to the engine that claims it.
type CheckpointOwner interface {
	IsCheckpoint(dir string) bool
}

// Holder is an engine that can tell cheaply (no process scan) whether it
// holds a sandbox: it has that id's directory.
type Holder interface {
	Holds(id string) bool
}

// Missing is an engine this binary has but this host cannot run (QEMU
// not installed, no guest kernel): a sandbox, snapshot or sleep image of
// it is refused with Why, never handed to another engine.
type Missing struct {
	// Why says what is missing and how to install it.
	Why error
	// IsCheckpoint recognises the engine's checkpoint directories without
	// the engine, so their restores are refused rather than tried by
	// another engine. Nil: recognised by the spec's engine name only.
	IsCheckpoint func(dir string) bool
}

// Engine dispatches to named engines.
type Engine struct {
	def     string
	engines map[string]engine.Engine
	missing map[string]Missing
	names   []string // default first, then sorted

	mu    sync.Mutex
	owner map[string]string // sandbox id -> engine name, as far as known
}

var (
	_ engine.Engine      = (*Engine)(nil)
	_ engine.Snapshotter = (*Engine)(nil)
	_ engine.Preparer    = (*Engine)(nil)
	_ engine.Inspector   = (*Engine)(nil)
)

// New serves engines; def names the default one, which must be among them.
// missing names the engines this host cannot run, each refused with its
// reason.
func New(def string, engines map[string]engine.Engine, missing map[string]Missing) (*Engine, error) {
	if engines[def] == nil {
		return nil, errors.New("multi: the default engine is not among the engines")
	}
	e := &Engine{def: def, engines: engines, missing: missing, owner: map[string]string{}}
	for n := range engines {
		if n != def {
			e.names = append(e.names, n)
		}
	}
	sort.Strings(e.names)
	e.names = append([]string{def}, e.names...)
	return e, nil
}

// Name implements engine.Engine: the default engine's name.
func (e *Engine) Name() string { return e.def }

// Names returns the engines served, the default first.
func (e *Engine) Names() []string { return slices.Clone(e.names) }

// Get returns the engine called name, or nil.
func (e *Engine) Get(name string) engine.Engine { return e.engines[name] }

// Status is one engine as the daemon reports it.
type Status struct {
	Name      string
	Default   bool
	Available bool
	// Why says, for an engine that is not available, what is missing.
	Why string
}

// Statuses lists the engines served (the default first) and then those
// missing, sorted.
func (e *Engine) Statuses() []Status {
	out := make([]Status, 0, len(e.names)+len(e.missing))
	for _, n := range e.names {
		out = append(out, Status{Name: n, Default: n == e.def, Available: true})
	}
	miss := make([]string, 0, len(e.missing))
	for n := range e.missing {
		miss = append(miss, n)
	}
	sort.Strings(miss)
	for _, n := range miss {
		out = append(out, Status{Name: n, Why: e.missing[n].Why.Error()})
	}
	return out
}

// missingErr is the refusal of work for engine name, which this host
// cannot run, as class cls.
func (e *Engine) missingErr(cls errdefs.Class, name string) error {
	return errdefs.New(cls, "the %s engine is not available on this host: %v", name, e.missing[name].Why)
}

// Version joins the engines' versions, for /v1/health.
func (e *Engine) Version(ctx context.Context) string {
	var parts []string
	for _, n := range e.names {
		if v, ok := e.engines[n].(interface{ Version(context.Context) string }); ok {
			s := v.Version(ctx)
			if n != e.def {
				s = n + ": " + s
			}
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

// pick returns the engine spec names. An engine this host lacks is
// refused as class cls: InvalidArgument for new sandboxes (the request
// cannot be served here), Unavailable for existing ones (installing the
// engine makes a retry work).
func (e *Engine) pick(spec engine.Spec, cls errdefs.Class) (string, engine.Engine, error) {
	name := spec.Engine
	if name == "" {
		name = e.def
	}
	eng := e.engines[name]
	if eng == nil {
		if _, ok := e.missing[name]; ok {
			return "", nil, e.missingErr(cls, name)
		}
		return "", nil, errdefs.New(errdefs.InvalidArgument, "unknown engine %q: use one of %s", name, strings.Join(e.names, ", "))
	}
	return name, eng, nil
}

// holder returns the engine that holds id: the one that made or attached
// it, else the first that lists it.
func (e *Engine) holder(ctx context.Context, id string) (engine.Engine, bool) {
	e.mu.Lock()
	name, ok := e.owner[id]
	e.mu.Unlock()
	if ok {
		return e.engines[name], true
	}
	for _, n := range e.names {
		ids, err := e.engines[n].List(ctx)
		if err == nil && slices.Contains(ids, id) {
			e.remember(id, n)
			return e.engines[n], true
		}
	}
	return nil, false
}

func (e *Engine) remember(id, name string) {
	e.mu.Lock()
	e.owner[id] = name
	e.mu.Unlock()
}

// evictOthers destroys id in every engine but name: a sandbox prepared by
// another engine (the warm pool prepares in the default one) gives way.
func (e *Engine) evictOthers(ctx context.Context, id, name string) error {
	for _, n := range e.names {
		if n == name {
			continue
		}
		ids, err := e.engines[n].List(ctx)
		if err == nil && slices.Contains(ids, id) {
			if err := e.engines[n].Destroy(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// Create implements engine.Engine.
func (e *Engine) Create(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	name, eng, err := e.pick(spec, errdefs.InvalidArgument)
	if err != nil {
		return nil, err
	}
	if err := e.evictOthers(ctx, spec.ID, name); err != nil {
		return nil, err
	}
	sb, err := eng.Create(ctx, spec)
	if err == nil {
		e.remember(spec.ID, name)
	}
	return sb, err
}

// Attach implements engine.Engine. A spec naming no engine (a record made
// while another engine was the default) goes to the engine that holds the
// id, so a daemon restarted with another --engine still finds its
// sandboxes; the default one if none says so.
func (e *Engine) Attach(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	name, eng, err := e.pick(spec, errdefs.Unavailable)
	if err != nil {
		return nil, err
	}
	if spec.Engine == "" {
		for _, n := range e.names {
			if h, ok := e.engines[n].(Holder); ok && h.Holds(spec.ID) {
				name, eng = n, e.engines[n]
				break
			}
		}
	}
	sb, err := eng.Attach(ctx, spec)
	if err == nil {
		e.remember(spec.ID, name)
	}
	return sb, err
}

// Destroy implements engine.Engine: every engine lets go of id.
func (e *Engine) Destroy(ctx context.Context, id string) error {
	var errs []error
	for _, n := range e.names {
		errs = append(errs, e.engines[n].Destroy(ctx, id))
	}
	e.mu.Lock()
	delete(e.owner, id)
	e.mu.Unlock()
	return errors.Join(errs...)
}

// List implements engine.Engine: the union of the engines' lists.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	var all []string
	for _, n := range e.names {
		ids, err := e.engines[n].List(ctx)
		if err != nil {
			return nil, err
		}
		all = append(all, ids...)
	}
	sort.Strings(all)
	return slices.Compact(all), nil
}

// Close implements engine.Engine.
func (e *Engine) Close() error {
	var errs []error
	for _, n := range e.names {
		errs = append(errs, e.engines[n].Close())
	}
	return errors.Join(errs...)
}

// Checkpoint implements engine.Snapshotter.
func (e *Engine) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	eng, ok := e.holder(ctx, id)
	if !ok {
		return errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	s, ok := eng.(engine.Snapshotter)
	if !ok {
		return errdefs.New(errdefs.InvalidArgument, "the %s engine cannot snapshot", eng.Name())
	}
	return s.Checkpoint(ctx, id, dir, leaveRunning)
}

// checkpointOwner is the name of the engine that claims checkpoint dir as its own.
func (e *Engine) checkpointOwner(dir string) (string, bool) {
	for _, n := range e.names {
		if o, ok := e.engines[n].(CheckpointOwner); ok && o.IsCheckpoint(dir) {
			return n, true
		}
	}
	return "", false
}

// Restore implements engine.Snapshotter: the engine that claims dir
// restores it, else spec's.
func (e *Engine) Restore(ctx context.Context, spec engine.Spec, dir string) (engine.Sandbox, error) {
	for n, m := range e.missing {
		if m.IsCheckpoint != nil && m.IsCheckpoint(dir) {
			return nil, e.missingErr(errdefs.Unavailable, n)
		}
	}
	name, eng, err := e.pick(spec, errdefs.Unavailable)
	if err != nil {
		return nil, err
	}
	if n, ok := e.checkpointOwner(dir); ok {
		name, eng = n, e.engines[n]
	}
	s, ok := eng.(engine.Snapshotter)
	if !ok {
		return nil, errdefs.New(errdefs.InvalidArgument, "the %s engine cannot restore", name)
	}
	if err := e.evictOthers(ctx, spec.ID, name); err != nil {
		return nil, err
	}
	sb, err := s.Restore(ctx, spec, dir)
	if err == nil {
		e.remember(spec.ID, name)
	}
	return sb, err
}

// Prepare implements engine.Preparer.
func (e *Engine) Prepare(ctx context.Context, spec engine.Spec) error {
	name, eng, err := e.pick(spec, errdefs.InvalidArgument)
	if err != nil {
		return err
	}
	p, ok := eng.(engine.Preparer)
	if !ok {
		return nil // nothing to do ahead; Create does it all
	}
	if err := p.Prepare(ctx, spec); err != nil {
		return err
	}
	e.remember(spec.ID, name)
	return nil
}

// SharesForkMemory implements engine.ForkSharer: asks the engine that
// wrote dir, or the one that holds id.
func (e *Engine) SharesForkMemory(ctx context.Context, id, dir string) bool {
	var eng engine.Engine
	if dir != "" {
		if n, ok := e.checkpointOwner(dir); ok {
			eng = e.engines[n]
		}
	} else {
		eng, _ = e.holder(ctx, id)
	}
	s, ok := eng.(engine.ForkSharer)
	return ok && s.SharesForkMemory(ctx, id, dir)
}

// Started implements engine.Inspector: started in any engine.
func (e *Engine) Started(ctx context.Context, id string) bool {
	for _, n := range e.names {
		i, ok := e.engines[n].(engine.Inspector)
		if ok && i.Started(ctx, id) {
			return true
		}
		if !ok { // cannot tell: an id it holds may hold a user's state
			if ids, err := e.engines[n].List(ctx); err == nil && slices.Contains(ids, id) {
				return true
			}
		}
	}
	return false
}

// Stats implements engine.Statser: the use read by the engine that holds
// id, when that engine can read it.
func (e *Engine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	eng, ok := e.holder(ctx, id)
	if !ok {
		return engine.Stats{}, errdefs.New(errdefs.NotFound, "sandbox %s is not running", id)
	}
	s, ok := eng.(engine.Statser)
	if !ok {
		return engine.Stats{}, errdefs.New(errdefs.InvalidArgument, "the %s engine cannot read sandboxes' resource use", eng.Name())
	}
	return s.Stats(ctx, id)
}
