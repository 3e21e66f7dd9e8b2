package network

import (
	"context"
	"net"
	"net/netip"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// Network modes of a sandbox.
const (
	// ModeInternet gives the sandbox a slot: its own address and a default
	// route, egress under its policy.
	ModeInternet = "internet"
	// ModeNone keeps a loopback-only network stack.
	ModeNone = "none"
)

// Hook attaches slots to the sandbox lifecycle: a sandbox with network
// mode internet holds a slot, keyed by its engine id, from before its
// engine sandbox starts until it stops (so a woken sandbox or a fork child
// gets a fresh one).
type Hook struct {
	n           *Network
	defaultMode string
	// unavailable says why n is nil (e.g. no nftables): a sandbox asking
	// for internet is refused with it.
	unavailable error
}

// NewHook returns the hook of n, with defaultMode for sandboxes that ask
// for no mode. n may be nil when networking is unavailable (why says
// why); then only mode none works.
func NewHook(n *Network, defaultMode string, why error) (*Hook, error) {
	if defaultMode != ModeInternet && defaultMode != ModeNone {
		return nil, errdefs.New(errdefs.InvalidArgument, "bad default network %q: use internet or none", defaultMode)
	}
	return &Hook{n: n, defaultMode: defaultMode, unavailable: why}, nil
}

// Network returns the hook's network, or nil.
func (h *Hook) Network() *Network { return h.n }

// Name implements sandbox.Hook.
func (h *Hook) Name() string { return "network" }

func policyOf(o *store.NetworkOptions) Policy {
	return Policy{Egress: o.Egress, Allow: o.Allow, Deny: o.Deny}
}

func internet(rec store.Sandbox) bool {
	return rec.Opts.Network != nil && rec.Opts.Network.Mode == ModeInternet
}

// CompleteOptions checks a new sandbox's network options and fills in the
// defaults (the daemon's mode, egress allow); the result is what the store
// records. Errors are InvalidArgument.
func (h *Hook) CompleteOptions(o *store.Options) error {
	if o.Network == nil {
		o.Network = &store.NetworkOptions{}
	}
	no := *o.Network
	if no.Mode == "" {
		no.Mode = h.defaultMode
	}
	switch no.Mode {
	case ModeNone:
		if no.Egress != "" || len(no.Allow) > 0 || len(no.Deny) > 0 {
			return errdefs.New(errdefs.InvalidArgument, "a sandbox with network none has no egress: drop --egress, --allow and --deny or use --network internet")
		}
		o.Network = &store.NetworkOptions{Mode: ModeNone}
		return nil
	case ModeInternet:
		if h.n == nil {
			return errdefs.New(errdefs.Unavailable, "networking is unavailable on this daemon (%v): use --network none", h.unavailable)
		}
	default:
		return errdefs.New(errdefs.InvalidArgument, "bad network mode %q: use internet or none", no.Mode)
	}
	p, err := policyOf(&no).Check()
	if err != nil {
		return err
	}
	o.Network = &store.NetworkOptions{Mode: ModeInternet, Egress: p.Egress, Allow: p.Allow, Deny: p.Deny}
	return nil
}

// UpdateOptions applies changed network options to a sandbox (to its slot
// when it holds one; a sleeping sandbox gets them when it wakes). The mode
// cannot change. Errors are InvalidArgument.
func (h *Hook) UpdateOptions(ctx context.Context, rec store.Sandbox, o *store.Options) error {
	old, nw := rec.Opts.Network, o.Network
	if nw == nil || old == nil || old.Mode != ModeInternet {
		return errdefs.New(errdefs.InvalidArgument, "sandbox %s has no network of its own (created with --network none): its egress cannot change", rec.ID)
	}
	if nw.Mode != "" && nw.Mode != old.Mode {
		return errdefs.New(errdefs.InvalidArgument, "the network mode of a sandbox cannot change: create a new one with --network %s", nw.Mode)
	}
	p, err := policyOf(nw).Check()
	if err != nil {
		return err
	}
	o.Network = &store.NetworkOptions{Mode: ModeInternet, Egress: p.Egress, Allow: p.Allow, Deny: p.Deny}
	if h.n == nil {
		return nil
	}
	if _, ok := h.n.Lookup(rec.Engine()); !ok {
		return nil
	}
	return h.n.SetPolicy(ctx, rec.Engine(), p)
}

// BeforeStart implements sandbox.Hook: a sandbox with network internet
// gets its slot (the one its engine id already holds, e.g. a prepared
// sandbox's) with its policy.
func (h *Hook) BeforeStart(ctx context.Context, rec store.Sandbox, spec *engine.Spec) error {
	if !internet(rec) {
		return nil
	}
	if h.n == nil {
		return errdefs.New(errdefs.Unavailable, "networking is unavailable on this daemon (%v)", h.unavailable)
	}
	s, err := h.n.Acquire(ctx, rec.Engine(), policyOf(rec.Opts.Network))
	if err != nil {
		return err
	}
	spec.NetNS = s.NetNS
	spec.DNS = []string{s.Resolver.String()}
	return nil
}

// AfterStart implements sandbox.Hook.
func (h *Hook) AfterStart(ctx context.Context, rec store.Sandbox, sb engine.Sandbox) error {
	return nil
}

// AfterStop implements sandbox.Hook: the slot goes.
func (h *Hook) AfterStop(ctx context.Context, rec store.Sandbox) error {
	if h.n == nil {
		return nil
	}
	return h.n.Release(ctx, rec.Engine())
}

// AfterRemove implements sandbox.Hook.
func (h *Hook) AfterRemove(ctx context.Context, rec store.Sandbox) error {
	return h.AfterStop(ctx, rec)
}

// Reconcile implements sandbox.Hook: only running sandboxes keep slots,
// with their recorded policies.
func (h *Hook) Reconcile(ctx context.Context, running, all []store.Sandbox) error {
	if h.n == nil {
		return nil
	}
	keep := map[string]Policy{}
	for _, rec := range running {
		if internet(rec) {
			keep[rec.Engine()] = policyOf(rec.Opts.Network)
		}
	}
	return h.n.Reclaim(ctx, keep)
}

// Addr returns a running sandbox's address, if it has a slot.
func (h *Hook) Addr(rec store.Sandbox) (netip.Addr, bool) {
	if h.n == nil {
		return netip.Addr{}, false
	}
	s, ok := h.n.Lookup(rec.Engine())
	return s.Addr, ok
}

// Dial connects from the host to port inside a running sandbox with a
// slot. Errors: NotFound when it holds none.
func (h *Hook) Dial(ctx context.Context, rec store.Sandbox, port int) (net.Conn, error) {
	if h.n == nil {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s has no network of its own", rec.ID)
	}
	return h.n.Dial(ctx, rec.Engine(), port)
}

// DialPort implements sandbox.PortDialer: a connection over the veth of
// the sandbox engineID to a server on its own address (one bound to its
// loopback only is reached through the agent instead). NotFound when the
// sandbox holds no slot (network none).
func (h *Hook) DialPort(ctx context.Context, engineID string, port int) (net.Conn, error) {
	if h.n == nil {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s has no network of its own", engineID)
	}
	return h.n.Dial(ctx, engineID, port)
}
