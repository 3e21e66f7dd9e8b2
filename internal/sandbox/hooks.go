package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/sandbox/pool"
	"github.com/clade-sandbox/clade/internal/store"
)

// Hook attaches a feature (network, volumes, secrets, ingress, metrics) to
// the sandbox lifecycle. The service calls every hook at fixed points, in
// order; hooks own the resources they make and name them by sandbox id, so a
// repeated call is harmless.
type Hook interface {
	// Name identifies the hook in logs and errors.
	Name() string
	// BeforeStart runs before the engine creates, restores or wakes the
	// sandbox rec and may fill in spec (e.g. the network namespace). On
	// error the start is abandoned and AfterStop is called.
	BeforeStart(ctx context.Context, rec store.Sandbox, spec *engine.Spec) error
	// AfterStart runs once the sandbox runs and its guest is connected:
	// created, restored from a snapshot, or woken.
	AfterStart(ctx context.Context, rec store.Sandbox, sb engine.Sandbox) error
	// AfterStop runs once the engine has let go of the sandbox (it slept,
	// failed to start, or was destroyed): it frees what BeforeStart took
	// for this run. It must be idempotent.
	AfterStop(ctx context.Context, rec store.Sandbox) error
	// AfterRemove runs once the sandbox is gone for good. It must be
	// idempotent.
	AfterRemove(ctx context.Context, rec store.Sandbox) error
	// Reconcile runs after a restart, once the store and the engine agree:
	// running lists the sandboxes that run, all every recorded one. The hook
	// frees whatever it holds for sandboxes not in all, and for those in
	// all but not running, what a run holds.
	Reconcile(ctx context.Context, running, all []store.Sandbox) error
}

// OptionsHook is a hook with a say in a sandbox's options: it checks and
// completes a new sandbox's options before the sandbox is recorded (e.g.
// fills in the daemon's default network), and applies changed options to
// an existing sandbox. Errors are InvalidArgument.
type OptionsHook interface {
	CompleteOptions(o *store.Options) error
	UpdateOptions(ctx context.Context, rec store.Sandbox, o *store.Options) error
}

// CreateHook is a hook that checks and completes the options of a sandbox
// made from an image (not restored from a snapshot) before it is recorded,
// e.g. resolves the volumes it names. Errors are InvalidArgument or
// NotFound.
type CreateHook interface {
	CompleteCreate(o *store.Options) error
}

// SnapshotHook is a hook that keeps a sandbox's state outside the engine's
// checkpoint (volumes) and copies it into snapshots.
type SnapshotHook interface {
	// SnapshotOptions returns the options a snapshot of rec records (its
	// children inherit them); stop says rec must be stopped for the
	// checkpoint, so that SnapshotTaken copies state consistent with it:
	// the snapshot then restores rec in place afterwards.
	SnapshotOptions(rec store.Sandbox) (o store.Options, stop bool)
	// SnapshotTaken copies the hook's state of rec into sn, after the
	// checkpoint and, when SnapshotOptions said stop, before rec restarts.
	SnapshotTaken(ctx context.Context, rec store.Sandbox, sn store.Snapshot) error
	// SnapshotRemoved frees what the hook holds for sn. Idempotent.
	SnapshotRemoved(ctx context.Context, sn store.Snapshot) error
}

// hookChain is the hooks, in order (Config.Hooks): the lifecycle calls
// them at its fixed points through these methods. It holds no state.
type hookChain []Hook

func (c hookChain) completeOptions(o *store.Options) error {
	if len(o.Volumes) > 0 && !c.hasHook(func(h Hook) bool { _, ok := h.(CreateHook); return ok }) {
		return errdefs.New(errdefs.InvalidArgument, "this daemon has no volumes")
	}
	for _, h := range c {
		if oh, ok := h.(OptionsHook); ok {
			if err := oh.CompleteOptions(o); err != nil {
				return err
			}
		}
		if ch, ok := h.(CreateHook); ok {
			if err := ch.CompleteCreate(o); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c hookChain) hasHook(is func(Hook) bool) bool {
	for _, h := range c {
		if is(h) {
			return true
		}
	}
	return false
}

// snapshotOptions asks the snapshot hooks what a snapshot of rec records
// and whether it must stop rec.
func (c hookChain) snapshotOptions(rec store.Sandbox) (store.Options, bool) {
	o, stop := rec.Opts, false
	for _, h := range c {
		if sh, ok := h.(SnapshotHook); ok {
			r := rec
			r.Opts = o
			var s bool
			o, s = sh.SnapshotOptions(r)
			stop = stop || s
		}
	}
	return o, stop
}

func (c hookChain) snapshotTaken(ctx context.Context, rec store.Sandbox, sn store.Snapshot) error {
	for _, h := range c {
		if sh, ok := h.(SnapshotHook); ok {
			if err := sh.SnapshotTaken(ctx, rec, sn); err != nil {
				return fmt.Errorf("%s: %w", h.Name(), err)
			}
		}
	}
	return nil
}

func (c hookChain) snapshotRemoved(ctx context.Context, sn store.Snapshot) error {
	var errs []error
	for _, h := range c {
		if sh, ok := h.(SnapshotHook); ok {
			if err := sh.SnapshotRemoved(ctx, sn); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// SetNetwork replaces the network options (egress policy) of a sandbox;
// a running one follows them at once, a sleeping one when it wakes.
// Errors: NotFound, InvalidArgument (a bad policy, a mode change, or a
// sandbox without a network of its own).
func (m *Manager) SetNetwork(ctx context.Context, ref string, n store.NetworkOptions) (store.Sandbox, error) {
	return m.EditNetwork(ctx, ref, func(store.NetworkOptions) (store.NetworkOptions, error) { return n, nil })
}

// EditNetwork is SetNetwork with the new options edit makes of the
// sandbox's current ones (zero when it has none), read and replaced under
// the sandbox's lock: concurrent edits do not lose each other's changes.
// Errors: edit's, and SetNetwork's.
func (m *Manager) EditNetwork(ctx context.Context, ref string, edit func(cur store.NetworkOptions) (store.NetworkOptions, error)) (store.Sandbox, error) {
	rec, unlock, err := m.locks.sandbox(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	var cur store.NetworkOptions
	if rec.Opts.Network != nil {
		cur = *rec.Opts.Network
	}
	n, err := edit(cur)
	if err != nil {
		return store.Sandbox{}, err
	}
	opts := rec.Opts
	opts.Network = &n
	found, err := m.hooks.updateOptions(ctx, rec, &opts)
	if err != nil {
		return store.Sandbox{}, err
	}
	if !found {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "this daemon has no networking")
	}
	if err := m.store.SetOptions(ctx, rec.ID, opts); err != nil {
		return store.Sandbox{}, err
	}
	rec.Opts = opts
	return rec, nil
}

func (c hookChain) beforeStart(ctx context.Context, rec store.Sandbox, spec *engine.Spec) error {
	for _, h := range c {
		if err := h.BeforeStart(ctx, rec, spec); err != nil {
			return errors.Join(fmt.Errorf("%s: %w", h.Name(), err), c.afterStop(ctx, rec))
		}
	}
	return nil
}

func (c hookChain) afterStart(ctx context.Context, rec store.Sandbox, sb engine.Sandbox) error {
	for _, h := range c {
		if err := h.AfterStart(ctx, rec, sb); err != nil {
			return fmt.Errorf("%s: %w", h.Name(), err)
		}
	}
	return nil
}

func (c hookChain) afterStop(ctx context.Context, rec store.Sandbox) error {
	var errs []error
	for _, h := range c {
		if err := h.AfterStop(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
		}
	}
	return errors.Join(errs...)
}

func (c hookChain) afterRemove(ctx context.Context, rec store.Sandbox) error {
	var errs []error
	for _, h := range c {
		if err := h.AfterRemove(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// updateOptions has the OptionsHooks apply o, changed options, to rec;
// found says whether there is one.
func (c hookChain) updateOptions(ctx context.Context, rec store.Sandbox, o *store.Options) (found bool, err error) {
	for _, h := range c {
		if oh, ok := h.(OptionsHook); ok {
			found = true
			if err := oh.UpdateOptions(ctx, rec, o); err != nil {
				return true, err
			}
		}
	}
	return found, nil
}

// reconcile runs every hook's Reconcile.
func (c hookChain) reconcile(ctx context.Context, running, all []store.Sandbox) error {
	var errs []error
	for _, h := range c {
		if err := h.Reconcile(ctx, running, all); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// dialPort tries the PortDialer hooks on the engine sandbox engineID;
// nil when none reached port.
func (c hookChain) dialPort(ctx context.Context, engineID string, port int) net.Conn {
	for _, h := range c {
		if pd, ok := h.(PortDialer); ok {
			if conn, err := pd.DialPort(ctx, engineID, port); err == nil {
				return conn
			}
		}
	}
	return nil
}

// poolNetwork is the network of a pool's sandbox of shape sh: the policy
// a plain create gets (the hooks fill in the daemon's defaults), so that
// the start or claim of the common create sends no nftables batch.
func (c hookChain) poolNetwork(sh pool.Shape) (*store.NetworkOptions, error) {
	o := store.Options{Network: &store.NetworkOptions{Mode: sh.Network}}
	for _, h := range c {
		if oh, ok := h.(OptionsHook); ok {
			if err := oh.CompleteOptions(&o); err != nil {
				return nil, err
			}
		}
	}
	return o.Network, nil
}
