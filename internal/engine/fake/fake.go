// Package fake is an in-memory engine for unit tests of the lifecycle's
// logic (admission, transitions, fork accounting, reconcile decisions, the
// pool). It runs nothing: tests that claim a sandbox works use the real
// engine. It implements engine.Engine, Snapshotter, Preparer and Inspector.
package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
)

var (
	_ engine.Engine      = (*Engine)(nil)
	_ engine.Snapshotter = (*Engine)(nil)
	_ engine.Preparer    = (*Engine)(nil)
	_ engine.Inspector   = (*Engine)(nil)
)

// Engine is the fake engine. Its hooks, when set, run at the start of the
// matching call and may fail it or widen a race window.
type Engine struct {
	OnCreate     func(spec engine.Spec) error
	OnRestore    func(spec engine.Spec) error
	OnCheckpoint func(id string) error
	// OnAttach may fail an attach of a running sandbox (e.g. Unavailable,
	// as an agent too slow to reconnect makes it).
	OnAttach func(spec engine.Spec) error
	// OnDestroy runs after a destroy, which it cannot fail.
	OnDestroy func(id string)
	// Delay is added to every create, restore and checkpoint.
	Delay time.Duration
	// SharesFork is what SharesForkMemory says (engine.ForkSharer), unless
	// OnSharesFork is set.
	SharesFork   bool
	OnSharesFork func(id, dir string) bool

	mu       sync.Mutex
	running  map[string]*Sandbox // guarded by mu
	prepared map[string]bool     // guarded by mu
	specs    map[string]engine.Spec
}

// New returns an empty fake engine.
func New() *Engine {
	return &Engine{running: map[string]*Sandbox{}, prepared: map[string]bool{}, specs: map[string]engine.Spec{}}
}

// Sandbox is a fake running sandbox.
type Sandbox struct {
	id     string
	client *guest.Conn
	exited chan struct{}
	once   sync.Once
	reason string
}

func (s *Sandbox) ID() string              { return s.id }
func (s *Sandbox) Guest() *guest.Conn      { return s.client }
func (s *Sandbox) PID() int                { return 0 }
func (s *Sandbox) Exited() <-chan struct{} { return s.exited }
func (s *Sandbox) ExitReason() string      { return s.reason }
func (s *Sandbox) stop(reason string)      { s.once.Do(func() { s.reason = reason; close(s.exited) }) }
func (e *Engine) Name() string             { return "fake" }
func (e *Engine) Started(_ context.Context, id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running[id] != nil
}

func (e *Engine) start(spec engine.Spec) (*Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[spec.ID] != nil {
		return nil, errdefs.New(errdefs.AlreadyExists, "fake: sandbox %s already runs", spec.ID)
	}
	delete(e.prepared, spec.ID)
	sb := &Sandbox{id: spec.ID, client: newGuest(), exited: make(chan struct{})}
	e.running[spec.ID] = sb
	e.specs[spec.ID] = spec
	return sb, nil
}

// Create implements engine.Engine.
func (e *Engine) Create(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	time.Sleep(e.Delay)
	if e.OnCreate != nil {
		if err := e.OnCreate(spec); err != nil {
			_ = e.Destroy(ctx, spec.ID)
			return nil, err
		}
	}
	return e.start(spec)
}

// Prepare implements engine.Preparer.
func (e *Engine) Prepare(ctx context.Context, spec engine.Spec) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.prepared[spec.ID] = true
	return nil
}

// Attach implements engine.Engine.
func (e *Engine) Attach(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sb := e.running[spec.ID]; sb != nil {
		if e.OnAttach != nil {
			if err := e.OnAttach(spec); err != nil {
				return nil, err
			}
		}
		// A new handle, as a restarted daemon would get.
		nsb := &Sandbox{id: spec.ID, client: newGuest(), exited: make(chan struct{})}
		e.running[spec.ID] = nsb
		return nsb, nil
	}
	return nil, errdefs.New(errdefs.NotFound, "fake: sandbox %s is not running", spec.ID)
}

// Destroy implements engine.Engine.
func (e *Engine) Destroy(ctx context.Context, id string) error {
	e.mu.Lock()
	sb := e.running[id]
	delete(e.running, id)
	delete(e.prepared, id)
	delete(e.specs, id)
	e.mu.Unlock()
	if sb != nil {
		sb.client.Close(nil)
		sb.stop("")
	}
	if e.OnDestroy != nil {
		e.OnDestroy(id)
	}
	return nil
}

// Kill makes a running sandbox die by itself with reason, as an OOM kill
// would.
func (e *Engine) Kill(id, reason string) {
	e.mu.Lock()
	sb := e.running[id]
	delete(e.running, id)
	e.mu.Unlock()
	if sb != nil {
		sb.stop(reason)
	}
}

// List implements engine.Engine: running and prepared sandboxes.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id := range e.running {
		ids = append(ids, id)
	}
	for id := range e.prepared {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Spec returns the spec a running sandbox was started with.
func (e *Engine) Spec(id string) (engine.Spec, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.specs[id]
	return s, ok
}

// Close implements engine.Engine.
func (e *Engine) Close() error { return nil }

// SharesForkMemory implements engine.ForkSharer: OnSharesFork, else
// e.SharesFork.
func (e *Engine) SharesForkMemory(_ context.Context, id, dir string) bool {
	if e.OnSharesFork != nil {
		return e.OnSharesFork(id, dir)
	}
	return e.SharesFork
}

// Checkpoint implements engine.Snapshotter: it writes a state file naming
// the sandbox. A failed checkpoint leaves the sandbox running.
func (e *Engine) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	time.Sleep(e.Delay)
	e.mu.Lock()
	sb := e.running[id]
	e.mu.Unlock()
	if sb == nil {
		return errdefs.New(errdefs.NotFound, "fake: sandbox %s is not running", id)
	}
	if e.OnCheckpoint != nil {
		if err := e.OnCheckpoint(id); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(id), 0o600); err != nil {
		return err
	}
	if !leaveRunning {
		if err := engine.Seal(ctx); err != nil {
			return err
		}
		e.mu.Lock()
		delete(e.running, id)
		e.mu.Unlock()
		sb.stop("")
	}
	return nil
}

// Restore implements engine.Snapshotter.
func (e *Engine) Restore(ctx context.Context, spec engine.Spec, dir string) (engine.Sandbox, error) {
	time.Sleep(e.Delay)
	if _, err := os.Stat(filepath.Join(dir, "state")); err != nil {
		_ = e.Destroy(ctx, spec.ID)
		return nil, fmt.Errorf("fake: restore %s: %w", spec.ID, err)
	}
	if e.OnRestore != nil {
		if err := e.OnRestore(spec); err != nil {
			_ = e.Destroy(ctx, spec.ID)
			return nil, err
		}
	}
	return e.start(spec)
}

// ErrInjected is a failure a test injects.
var ErrInjected = errors.New("fake: injected failure")
