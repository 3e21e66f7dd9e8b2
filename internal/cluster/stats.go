package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// statsParallel bounds the readings of named sandboxes in flight.
const statsParallel = 8

// ListStats reads the use of every node's sandboxes with labels (this
// node's own, each other live node's through its peer route, in
// parallel, each within the wait), or of the sandboxes refs names, each
// where it is. Every reading says its node. A node that does not answer
// in time is said in the readings of the sandboxes the directory gives it
// (Error), not by failing the call; the sandboxes of nodes that are not
// live (lost, or asleep on a node that left) are read from the directory:
// their state, no use.
func (a *Across) ListStats(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error) {
	if len(refs) > 0 {
		return a.statsOf(ctx, refs)
	}
	self := a.self()
	own, err := a.s.Service.ListStats(ctx, nil, labels)
	if err != nil {
		return nil, err
	}
	for i := range own {
		own[i].Node = self
	}
	nodes, ok := a.liveNodes(ctx)
	recs, err := a.s.c.Records(ctx)
	if !ok || err != nil {
		a.s.c.cfg.Log.Warn("cluster: stats without the other nodes (etcd does not answer)", "err", err)
		return own, nil
	}
	type got struct {
		sts []api.SandboxStats
		err error
	}
	res := map[string]got{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range sortedNodes(nodes) {
		if n.Name == self {
			continue
		}
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, a.wait)
			defer cancel()
			var g got
			c, err := a.client(n)
			if err == nil {
				g.sts, err = c.Peer().NodeStats(wctx, labels)
			}
			if err != nil {
				g.err = err
				if wctx.Err() != nil && ctx.Err() == nil {
					g.err = fmt.Errorf("did not answer within %s", a.wait)
				}
			}
			mu.Lock()
			res[n.Name] = g
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := own
	have := map[string]bool{}
	for _, st := range own {
		have[st.ID] = true
	}
	for _, n := range sortedNodes(nodes) {
		if g, ok := res[n.Name]; ok && g.err == nil {
			for _, st := range g.sts {
				st.Node = n.Name
				have[st.ID] = true
				out = append(out, st)
			}
		}
	}
	// What the directory has that no node answered for: the sandboxes of
	// a node that did not answer, or that is not live.
	for _, r := range recs {
		if have[r.ID] || !hasLabels(r.Sandbox.Labels, labels) || r.Node == self && r.State != StateLost {
			continue
		}
		if g, ok := res[r.Node]; ok && g.err == nil {
			continue // its node answered: what it did not list is gone (or not yet made)
		}
		st := api.SandboxStats{ID: r.ID, Name: r.Name, State: r.State, Node: r.Node, CPUs: r.Sandbox.CPUs,
			MemoryLimitBytes: uint64(max(r.Sandbox.MemoryMiB, 0)) << 20, ReadAt: time.Now().UTC()}
		if g, ok := res[r.Node]; ok && g.err != nil {
			st.Error = fmt.Sprintf("node %s %v: no reading", r.Node, g.err)
			if n := nodes[r.Node]; isTransport(g.err) && !strings.HasPrefix(g.err.Error(), "did not answer") {
				// The SDK's words are a CLI user's: the cluster's here.
				st.Error = notAnswering(n, g.err) + ": no reading"
			}
		} else if r.State == StateLost {
			st.Error = r.Reason
		}
		have[r.ID] = true
		out = append(out, st)
	}
	return out, nil
}

func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// statsOf reads each sandbox of refs where it is, in refs' order. An
// unknown one fails the call (NotFound, as one node's); one whose node
// does not answer within the wait, or that is lost, has its reading's
// Error say so.
func (a *Across) statsOf(ctx context.Context, refs []string) ([]api.SandboxStats, error) {
	out := make([]api.SandboxStats, len(refs))
	errs := make([]error, len(refs))
	sem := make(chan struct{}, statsParallel)
	var wg sync.WaitGroup
	for i, ref := range refs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = a.statOne(ctx, ref)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (a *Across) statOne(ctx context.Context, ref string) (api.SandboxStats, error) {
	if sb, err := a.s.Service.Get(ctx, ref); err == nil && sb.State != "sleeping" {
		st, err := a.s.Service.Stats(ctx, sb.ID)
		st.Node = a.self()
		return st, err
	}
	wctx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	st, err := a.s.Stats(wctx, ref)
	rec, found, lerr := a.s.c.Lookup(ctx, ref)
	node := a.self()
	if lerr == nil && found && (err != nil || rec.ID == st.ID) {
		node = rec.Node
	}
	if err == nil {
		st.Node = node
		return st, nil
	}
	if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) || ctx.Err() != nil || !found {
		return api.SandboxStats{}, err
	}
	msg := err.Error()
	if wctx.Err() != nil {
		msg = fmt.Sprintf("node %s did not answer within %s: no reading", rec.Node, a.wait)
	} else if rec.State == StateLost {
		msg = rec.Reason
	}
	return api.SandboxStats{ID: rec.ID, Name: rec.Name, State: rec.State, Node: rec.Node, CPUs: rec.Sandbox.CPUs,
		MemoryLimitBytes: uint64(max(rec.Sandbox.MemoryMiB, 0)) << 20, ReadAt: time.Now().UTC(), Error: msg}, nil
}
