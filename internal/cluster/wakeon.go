package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// wakeOnTries bounds how often WakeOn reads the record again: when
// another write (a wake, a sleep, a drain) changed it between the read and
// the give, or while its node has sealed the image's copy but not yet
// written the record that names it.
const wakeOnTries = 10

// WakeOn wakes sleeping sandbox ref on the named node (service.Nodes):
// its own node's wake when it sleeps there; otherwise the record is given
// to that node, which fetches its image from the object store and wakes
// it, as a drain's move does. Only a sleeping sandbox whose image has its
// copy in the store moves so, and only to a live node that is not
// draining, runs its engine, can open its image, takes its size and has
// room for it now.
func (s *Service) WakeOn(ctx context.Context, ref, node string) (api.Sandbox, error) {
	if node == "" {
		return s.Wake(ctx, ref)
	}
	from := "" // the node it slept on at the first read
	for try := 0; ; try++ {
		rec, ok, err := s.c.Lookup(ctx, ref)
		if err != nil {
			return api.Sandbox{}, err
		}
		if !ok {
			return api.Sandbox{}, errdefs.New(errdefs.NotFound, "no sandbox %q in the cluster", ref)
		}
		if rec.State == StateLost {
			return api.Sandbox{}, lostError(rec)
		}
		if rec.Node == node {
			// Woken there or not at all: a plain wake's fallbacks (a
			// refusal for room, or its node gone, give it to a node
			// placement picks) would wake it on a node not asked for.
			if _, live, err := s.c.node(ctx, node); err != nil {
				return api.Sandbox{}, err
			} else if !live && rec.State == "sleeping" {
				return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s sleeps on node %s, which is not in the cluster now: wake it without a node (placement picks one that can), or on a live node", rec.ID, node)
			}
			sb, err := s.wake(ctx, ref, false)
			if err == nil && sb.Node != node {
				return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s was moved to node %s by another call meanwhile: it runs on %s, not on %s",
					rec.ID, sb.Node, sb.Node, node)
			}
			return sb, err
		}
		if from == "" {
			from = rec.Node
		} else if rec.Node != from {
			// Another call (a wake --node to another node, a drain, a
			// plain wake's fallback) gave it away between the reads:
			// moving it on would move it twice, and the other call's
			// wake may be on its way to it.
			return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s was moved to node %s meanwhile (another wake or a drain): it does not wake on node %s; see clade inspect %s",
				rec.ID, rec.Node, node, rec.ID)
		}
		switch {
		case rec.State == StateImporting:
			return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "sandbox %s is a fork's child that node %s is still importing (fetching the snapshot): it is not asleep, so it wakes nowhere else", rec.ID, rec.Node)
		case rec.State == StateMoving:
			return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "sandbox %s is being moved to node %s: try again when it settles", rec.ID, rec.Node)
		case rec.State != "sleeping":
			return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is %s on node %s: only a sleeping sandbox wakes on another node; sleep it first (clade sleep %s)",
				rec.ID, rec.State, rec.Node, rec.ID)
		case !movable(rec):
			// Its node may have sealed the copy an instant ago: it
			// writes the record again at once (a second's pass at most
			// when that write failed).
			if got, err := s.Get(ctx, rec.ID); err == nil && got.SleepImage != "" && try < wakeOnTries {
				s.c.awaitSleepImage(ctx, rec.ID, 1500*time.Millisecond)
				if err := ctx.Err(); err != nil {
					return api.Sandbox{}, err
				}
				continue
			}
			return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s wakes only on node %s: %s", rec.ID, rec.Node, whyNotMovable)
		}
		cur, rev, claimed, found, err := s.c.lookupRev(ctx, rec.ID)
		if err != nil {
			return api.Sandbox{}, err
		}
		// Movable still: a record that names no image now (its node
		// wakes it: holdWake; or woke and slept it again, the new copy
		// not sealed) given to node would name a sandbox that node
		// cannot adopt, and its node, fenced, would remove it.
		if !found || claimed || cur.Node != rec.Node || cur.State != rec.State || !movable(cur) {
			if try >= wakeOnTries {
				return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "sandbox %s keeps changing under the wake: try again", rec.ID)
			}
			continue
		}
		nodes, err := s.c.Nodes(ctx)
		if err != nil {
			return api.Sandbox{}, err
		}
		target, done, err := s.moves.reserveOn(nodes, cur, node)
		if err != nil {
			return api.Sandbox{}, err
		}
		if _, err := s.c.Reassign(ctx, cur, rev, node, false); err != nil {
			done(false)
			if errors.Is(err, errMoveRace) && try < wakeOnTries {
				continue
			}
			if errors.Is(err, errMoveRace) {
				return api.Sandbox{}, errdefs.New(errdefs.Unavailable, "sandbox %s keeps changing under the wake: try again", rec.ID)
			}
			return api.Sandbox{}, err
		}
		s.forgetRoute(rec.ID)
		sb, err := s.wake(ctx, rec.ID, false)
		done(err == nil)
		if err == nil && sb.Node != target.Name {
			// Another call gave it on (a wake --node to another node
			// that read the record after this give) before the target
			// adopted it: it runs where that call asked, not here.
			s.c.cfg.Log.Info("cluster: a wake asked for on one node woke on another", "sandbox", rec.ID, "asked", target.Name, "woke", sb.Node)
			return api.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s was moved on to node %s by another call before node %s took it: it runs on %s, not on %s",
				rec.ID, sb.Node, target.Name, sb.Node, target.Name)
		}
		return sb, err
	}
}

// reserveOn checks that sleeping rec may be given to node now and takes
// that node's room for it until done, as a drain's move does (reserve).
func (mv *moves) reserveOn(nodes []api.Node, rec Record, node string) (api.Node, func(ok bool), error) {
	i := slices.IndexFunc(nodes, func(n api.Node) bool { return n.Name == node })
	if i < 0 {
		var names []string
		for _, n := range nodes {
			names = append(names, n.Name)
		}
		return api.Node{}, nil, errdefs.New(errdefs.NotFound, "no live node %q in the cluster (live: %s): see clade node ls", node, strings.Join(names, ", "))
	}
	n := nodes[i]
	c := n.Capacity
	why := ""
	switch {
	case n.Draining:
		why = "it is draining (clade node undrain " + node + " lets it take sandboxes again)"
	case !opens(n, rec):
		why = fmt.Sprintf("it cannot open the sandbox's sleep image: the image is %s in the object store, and node %s has %s", imageKeyWords(rec.SleepKey), node, keyWords(c.StoreKey))
	case c.MaxMemoryMiB > 0 && int64(rec.Sandbox.MemoryMiB) > c.MaxMemoryMiB:
		why = fmt.Sprintf("it takes sandboxes of at most %d MiB (--max-memory) and this one has %d MiB", c.MaxMemoryMiB, rec.Sandbox.MemoryMiB)
	case c.MaxCPUs > 0 && rec.Sandbox.CPUs > c.MaxCPUs:
		why = fmt.Sprintf("it takes sandboxes of at most %g CPUs (--max-cpus) and this one has %g", c.MaxCPUs, rec.Sandbox.CPUs)
	}
	if why != "" {
		return api.Node{}, nil, errdefs.New(errdefs.Conflict, "sandbox %s cannot wake on node %s: %s", rec.ID, node, why)
	}
	mv.placeMu.Lock()
	defer mv.placeMu.Unlock()
	cs := mv.candidates([]api.Node{n}, rec, "")
	if len(cs) == 0 {
		return api.Node{}, nil, errdefs.New(errdefs.Conflict, "sandbox %s cannot wake on node %s: the node does not run its engine (%s)", rec.ID, node, cmp.Or(rec.Sandbox.Engine, "the default"))
	}
	if cs[0].free < 0 {
		return api.Node{}, nil, errdefs.New(errdefs.ResourceExhausted, "sandbox %s cannot wake on node %s now: %s; try again later, or wake it without a node", rec.ID, node, roomWords(cs))
	}
	done := mv.pending.add(n.Name, rec.ID, cmpInt(int64(rec.Sandbox.MemoryMiB), c.DefaultMemoryMiB))
	return n, func(ok bool) { done(ok) }, nil
}
