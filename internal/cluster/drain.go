package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// A drained node empties itself (issue 25: no new placements; sleeping
// and idle sandboxes move off). While its drain/NAME mark is in etcd, the
// node looks every drainEvery at what it holds:
//
//   - an idle running sandbox (no exec, attach or file call in flight, no
//     ingress or port connection open, none for the last 2 s: the
//     sleepers' own test, service.Drainer) that some other node can take
//     is put to sleep here, its image sealed and copied to the object
//     store as any sleep's is;
//   - a sleeping sandbox whose record names its image in the store is
//     given to the node placement picks (the move's first step, as
//     drainSleeping does at the drain call), and one that was running
//     before the drain slept it is woken there at once: its processes
//     (servers, background work) run on after a pause of one sleep, one
//     fetch and one wake, instead of stopping until someone calls it;
//     a sandbox the user had put to sleep stays asleep (it is adopted at
//     its next call);
//   - a busy sandbox stays, listed with what holds it, and moves at a
//     later pass once it is idle; one that cannot move (no
//     --object-store, volumes, secrets, no other node takes it) stays.
//
// The node writes its progress (api.DrainProgress) with its capacity, so
// `clade node drain` and `clade node ls` through any node show it.

// drainEvery is how often a drained node looks at what it holds.
const drainEvery = time.Second

// drainParallel is how many sandboxes a drain pass moves at once: each
// move is a sleep here, or a give and a wake on another node (a fetch and
// a restore there), mostly waiting on disks, the object store and other
// nodes, so a node of many idle sandboxes empties about this many times
// faster than one at a time; more would only queue on the same disks.
const drainParallel = 4

// drainState is the drain's bookkeeping on the drained node; only the
// drain loop touches it, and a pass's moves under mu.
type drainState struct {
	on   bool
	pass int64

	mu sync.Mutex // guards moved and woken while a pass's moves run
	// moved are the sandboxes given away since the drain began (each
	// counted once).
	moved map[string]bool
	// woken are the sandboxes this drain put to sleep: woken on the node
	// they are given to (or here again, should the drain end first).
	woken map[string]bool
	// retried says the last sandbox held for room that the drain moved
	// on as soon as room appeared (api.DrainProgress.Retried), retries
	// how many it did.
	retried string
	retries int
}

func (st *drainState) setRetried(words string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.retried = words
	st.retries++
}

func (st *drainState) setMoved(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.moved[id] = true
}

func (st *drainState) isMoved(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.moved[id]
}

func (st *drainState) nMoved() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.moved)
}

func (st *drainState) setWoken(id string, on bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if on {
		st.woken[id] = true
	} else {
		delete(st.woken, id)
	}
}

func (st *drainState) isWoken(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.woken[id]
}

// drainLoop runs the drain passes of this node while it is drained,
// until ctx ends.
func (mv *moves) drainLoop(ctx context.Context) {
	t := time.NewTicker(drainEvery)
	defer t.Stop()
	st := &drainState{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		on, err := mv.c.drained(ctx)
		if err != nil {
			continue // etcd out of reach: as it was
		}
		if !on {
			if st.on {
				mv.undrained(ctx, st.woken)
				st = &drainState{}
				mv.c.drain.Store(nil)
			}
			continue
		}
		if !st.on {
			st = &drainState{on: true, moved: map[string]bool{}, woken: map[string]bool{}}
			mv.c.cfg.Log.Info("cluster: this node is drained: moving its sandboxes to other nodes")
		}
		mv.c.drain.Store(mv.drainPass(ctx, st))
	}
}

// undrained wakes here again the sandboxes the drain put to sleep and
// did not give away before it ended: they were running.
func (mv *moves) undrained(ctx context.Context, woken map[string]bool) {
	for id := range woken {
		sb, err := mv.local.Get(ctx, id)
		if err != nil || sb.State != "sleeping" {
			continue
		}
		if rec, ok, err := mv.c.Lookup(ctx, id); err != nil || !ok || rec.Node != mv.c.cfg.Node {
			continue // given away meanwhile
		}
		if _, err := mv.svc.Wake(ctx, id); err != nil {
			mv.c.cfg.Log.Warn("cluster: the drain ended: wake a sandbox it had put to sleep (it wakes at its next call)", "sandbox", id, "err", err)
		}
	}
}

// drained reads whether this node is marked draining.
func (c *Cluster) drained(ctx context.Context) (bool, error) {
	ctx, cancel := c.opCtx(ctx)
	defer cancel()
	r, err := c.cli.Get(ctx, drainKey(c.cfg.Node), clientv3.WithCountOnly())
	if err != nil {
		return false, err
	}
	return r.Count > 0, nil
}

// drainPass is one look at what the drained node holds (see above). It
// moves up to drainParallel sandboxes at once, and writes the progress as
// each is done: what moved, and what is left (those not looked at yet
// counted by their state), so that a long pass shows its moves as they
// go.
func (mv *moves) drainPass(ctx context.Context, st *drainState) *api.DrainProgress {
	st.pass++
	p := &api.DrainProgress{Pass: st.pass, Settled: true}
	sbs, err := mv.local.List(ctx)
	if err != nil {
		p.Settled, p.Note = false, "this node cannot list its sandboxes: "+err.Error()
		return p
	}
	nodes, err := mv.c.Nodes(ctx)
	if err != nil {
		p.Settled, p.Note = false, err.Error()
		return p
	}
	d, _ := mv.local.(service.Drainer)
	results := make([]*api.DrainProgress, len(sbs))
	var mu sync.Mutex // guards results
	sum := func() *api.DrainProgress {
		q := &api.DrainProgress{Pass: st.pass, Settled: true}
		for i, r := range results {
			if r == nil { // not looked at yet: left, as it was (unless given away)
				if st.isMoved(sbs[i].ID) {
					continue
				}
				if sbs[i].State == "sleeping" {
					q.Sleeping++
				} else {
					q.Running++
				}
				q.Settled = false
				continue
			}
			q.Running += r.Running
			q.Sleeping += r.Sleeping
			q.Held = append(q.Held, r.Held...)
			q.Settled = q.Settled && r.Settled
			q.Note = cmpOr(r.Note, q.Note)
		}
		q.Moved = st.nMoved()
		st.mu.Lock()
		q.Retried, q.Retries = st.retried, st.retries
		st.mu.Unlock()
		return q
	}
	// Each sandbox is looked at once, up to drainParallel at once. While
	// the pass goes on (other moves under way: a pass waits for its
	// slowest move), one held for room only is looked at again as soon as
	// a node has room for it, and one with a step of its move under way
	// here (put to sleep, its copy being made) about every second: the
	// held one would otherwise wait for the slowest move too.
	type outcome struct {
		i     int
		room  *Record // held for room only: the record its room was asked for
		again bool    // a step of its move under way here: look again
	}
	finished := make(chan outcome, len(sbs))
	sem := make(chan struct{}, drainParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	active := 0
	look := func(i int, sb api.Sandbox, nodes []api.Node) {
		active++
		// Looked at again: left as it is now until this look ends (its
		// last look's part would count it twice once it is given away).
		mu.Lock()
		results[i], sbs[i] = nil, sb
		mu.Unlock()
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r, room := mv.drainOne(ctx, st, nodes, d, sb)
			again := room == nil && !r.Settled && len(r.Held) == 0 && !st.isMoved(sb.ID)
			mu.Lock()
			results[i] = r
			interim := sum()
			interim.Settled = false // the pass goes on
			mv.c.drain.Store(interim)
			mu.Unlock()
			finished <- outcome{i, room, again}
		})
	}
	for i, sb := range sbs {
		look(i, sb, nodes)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var changed <-chan struct{}
	held := map[int]Record{} // held for room, by index in sbs
	again := map[int]bool{}  // a step under way here, by index in sbs
	var lastAgain time.Time  // when those were last looked at again
	for active > 0 {
		tick := false
		select {
		case o := <-finished:
			active--
			switch {
			case o.room != nil:
				held[o.i] = *o.room
			case o.again:
				again[o.i] = true
			}
		case <-changed:
			tick = true
		}
		if len(held)+len(again) == 0 || active == 0 {
			continue // none waits, or the pass ends (the next one looks again)
		}
		if changed == nil {
			changed = mv.nodesChanged(wctx)
		}
		// A move done (its room on its node counted or given back),
		// another node's capacity written, a node joined or undrained:
		// room may have appeared.
		nodes, err := mv.c.Nodes(ctx)
		if err != nil {
			continue
		}
		if tick && time.Since(lastAgain) >= drainEvery {
			lastAgain = time.Now()
			for i := range again {
				delete(again, i)
				if sb, err := mv.local.Get(ctx, sbs[i].ID); err == nil {
					look(i, sb, nodes)
				}
			}
		}
		for i, rec := range held {
			to := mv.roomOn(nodes, rec)
			if to == "" {
				continue
			}
			sb, err := mv.local.Get(ctx, sbs[i].ID)
			if err != nil {
				continue // removed meanwhile: the next pass counts it
			}
			delete(held, i)
			words := fmt.Sprintf("node %s has room now: moving %s, held for room", to, cmpOr(sb.Name, sb.ID))
			st.setRetried(words)
			mv.c.cfg.Log.Info("cluster: drain: "+words, "sandbox", sb.ID)
			look(i, sb, nodes)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return sum()
}

// nodesChanged signals each write of a node's key or drain mark (a
// capacity refresh, a node joining, leaving, drained or undrained) until
// ctx ends; and every drainEvery should etcd not tell.
func (mv *moves) nodesChanged(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	nw := mv.c.cli.Watch(ctx, nodesPrefix(), clientv3.WithPrefix())
	dw := mv.c.cli.Watch(ctx, drainPrefix(), clientv3.WithPrefix())
	go func() {
		t := time.NewTicker(drainEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-nw:
				if !ok {
					nw = nil // etcd out of reach: the ticker goes on
				}
			case _, ok := <-dw:
				if !ok {
					dw = nil
				}
			case <-t.C:
			}
			signal()
		}
	}()
	return ch
}

// drainOne is a drain pass's look at one sandbox: its part of the
// progress (Settled true when nothing of it is under way), and, when only
// room on another node holds it, the record the room was asked for.
func (mv *moves) drainOne(ctx context.Context, st *drainState, nodes []api.Node, d service.Drainer, sb api.Sandbox) (*api.DrainProgress, *Record) {
	p := &api.DrainProgress{Settled: true}
	hold := func(sb api.Sandbox, busy bool, why string) {
		p.Held = append(p.Held, api.DrainHold{ID: sb.ID, Name: sb.Name, State: sb.State, Busy: busy, Why: why})
	}
	switch sb.State {
	case "sleeping":
		return p, mv.drainSleeper(ctx, st, p, nodes, sb, hold)
	case "running":
		p.Running++
		if d == nil {
			hold(sb, false, "this node cannot put its sandboxes to sleep to move them")
			return p, nil
		}
		if full, err := mv.local.Get(ctx, sb.ID); err == nil {
			sb = full // the record's view: image, engine, shape
		}
		rec := Record{ID: sb.ID, Node: mv.c.cfg.Node, Sandbox: sb, SleepKey: mv.c.cfg.StoreKey}
		if why := mv.whyStays(nodes, rec); why != "" {
			hold(sb, false, why)
			return p, nil
		}
		if why := mv.noRoom(nodes, rec); why != "" {
			// Put to sleep now, it would wait asleep for room.
			hold(sb, false, why)
			return p, &rec
		}
		busy, err := d.SleepIdle(ctx, sb.ID)
		switch {
		case errdefs.IsNotFound(err):
			p.Running--
		case errdefs.Is(err, errdefs.Conflict):
			if strings.Contains(err.Error(), "--object-store") {
				p.Note = err.Error()
			}
			hold(sb, false, err.Error())
		case err != nil:
			p.Settled = false
			hold(sb, false, "its sleep failed: "+err.Error())
		case busy != "":
			hold(sb, true, busy)
		default:
			p.Running--
			p.Sleeping++
			p.Settled = false
			st.setWoken(sb.ID, true)
		}
	default:
		// Being made, put to sleep, woken or removed: the next pass.
		p.Running++
		p.Settled = false
	}
	return p, nil
}

// drainSleeper gives sleeping sb to another node when its record names
// its image in the store, and wakes it there when the drain slept it. It
// answers the record when only room on another node holds it.
func (mv *moves) drainSleeper(ctx context.Context, st *drainState, p *api.DrainProgress, nodes []api.Node, sb api.Sandbox, hold func(api.Sandbox, bool, string)) *Record {
	p.Sleeping++
	rec, rev, claimed, ok, err := mv.c.lookupRev(ctx, sb.ID)
	switch {
	case err != nil:
		p.Settled = false
		hold(sb, false, err.Error())
		return nil
	case ok && !claimed && rec.Node != mv.c.cfg.Node && mv.movedAway(ctx, sb.ID):
		// Given away (by the drain call, or a call through another
		// node): this copy is gone now.
		p.Sleeping--
		st.setMoved(sb.ID)
		return nil
	case !ok || claimed || rec.Node != mv.c.cfg.Node || rec.State != "sleeping":
		// Its record is not written yet, or it is being moved.
		p.Settled = false
		return nil
	case rec.SleepImage == "":
		if m := mv.mover(); m != nil {
			if _, err := m.SleepImage(ctx, sb.ID); errdefs.IsNotFound(err) && !strings.Contains(err.Error(), "--object-store") {
				p.Settled = false // its copy is being made
				return nil
			} else if err != nil {
				hold(sb, false, err.Error())
				return nil
			}
		}
		p.Settled = false // sealed: the record names it at the next write
		return nil
	}
	if why := mv.whyStays(nodes, rec); why != "" {
		hold(sb, false, why)
		return nil
	}
	// One the drain put to sleep is woken there at once: only a node with
	// room for it now takes it, its memory counted on that node until the
	// wake is done (the moves of a pass run together).
	wake := st.isWoken(sb.ID)
	to, done, err := mv.give(ctx, rec, rev, wake)
	var room errNoRoom
	switch {
	case errors.As(err, &room):
		hold(sb, false, room.why) // it moves once a node has room
		return &rec
	case err != nil:
		p.Settled = false
		if !errors.Is(err, errMoveRace) {
			hold(sb, false, err.Error())
		}
		return nil
	}
	st.setMoved(sb.ID)
	p.Sleeping--
	p.Settled = false
	if !wake {
		mv.movedAway(ctx, sb.ID) // this copy goes now
		return nil
	}
	st.setWoken(sb.ID, false)
	// Running before the drain: woken on its new node now.
	mv.svc.forgetRoute(sb.ID)
	wctx, cancel := context.WithTimeout(ctx, moveWait)
	defer cancel()
	t0 := time.Now()
	_, err = mv.svc.Wake(wctx, sb.ID)
	done(err == nil)
	if err != nil {
		mv.c.cfg.Log.Warn("cluster: drain: wake a moved sandbox on its new node (it wakes at its next call)", "sandbox", sb.ID, "node", to.Node, "err", err)
		return nil
	}
	mv.c.cfg.Log.Info("cluster: drain: running sandbox moved to another node", "sandbox", sb.ID, "node", to.Node, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// whyStays says why sb can go to no other node now ("" when one takes
// it): no other live node that is not draining runs its engine, has its
// image and takes its size.
func (mv *moves) whyStays(nodes []api.Node, rec Record) string {
	if len(mv.candidates(nodes, rec, "")) > 0 {
		return ""
	}
	sb := rec.Sandbox
	if other := otherKeys(nodes, rec, ""); len(other) > 0 {
		return fmt.Sprintf("no other node takes it now: its sleep image is %s, and %s (every node needs --encrypt-at-rest and the same --key-file to wake another node's image)", imageKeyWords(rec.SleepKey), strings.Join(other, ", "))
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if n.Name != mv.c.cfg.Node {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	return fmt.Sprintf("no other node takes it now (of %s: not draining, its engine, image %q, %d MiB and %g CPUs)", cmpOr(strings.Join(names, ", "), "none"), sb.Image, sb.MemoryMiB, sb.CPUs)
}
