package cluster

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/sdk"
)

// Across is the part of a node that reads across every live node of the
// cluster: the merged event stream (GET /v1/events?cluster=true) and the
// stats of every node's sandboxes (GET /v1/stats, stats.go). It reaches
// the other nodes' own events and stats through their peer-only routes
// (/v1/internal/events, /v1/internal/stats) with the cluster token.
type Across struct {
	s *Service

	mu      sync.Mutex
	clients map[string]*sdk.Client // by address; guarded by mu
	// silent are the nodes whose last probe (the daemon's prober's, or a
	// stream's open) found them silent, and why; guarded by mu. A stream
	// that opens meanwhile does not wait for them (probe.go).
	silent map[string]silence
	// streams is how many merged streams are open, lastUse when the last
	// one closed, probing whether the prober runs; guarded by mu.
	streams int
	lastUse time.Time
	probing bool

	// poll is how often a merged stream reads the live nodes; wait how
	// long a node has to answer a stats read or to open its part of a
	// stream; slow how long a merged stream waits for a client that reads
	// nothing while its buffer is full before it cuts the client off.
	poll, wait, slow time.Duration
}

// silence is a node's last probe that found it silent: when the probe
// began, and what a stream says of it.
type silence struct {
	at  time.Time
	why string
}

// silentFor is how long a probe that found a node silent spares new
// streams the wait on it (the prober's next probes say it again).
const silentFor = 10 * time.Second

// mergedBuffer is how many events a merged stream holds for its client
// (the bus's own bound per subscriber): with each node's part holding at
// most one more, a slow client costs the node a bounded amount of memory.
const mergedBuffer = 1024

// NewAcross returns the reads across the nodes of s's cluster.
func NewAcross(s *Service) *Across {
	return &Across{s: s, clients: map[string]*sdk.Client{}, silent: map[string]silence{}, poll: time.Second, wait: 3 * time.Second, slow: 10 * time.Second}
}

// client is the SDK client of node n's API, with the cluster token.
func (a *Across) client(n api.Node) (*sdk.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.clients[n.Addr]; ok {
		return c, nil
	}
	c, err := peerClient(n, a.s.c.cfg.Token)
	if err != nil {
		return nil, err
	}
	if len(a.clients) > 1000 {
		clear(a.clients) // addresses of nodes long gone
	}
	a.clients[n.Addr] = c
	return c, nil
}

// self is this node's name.
func (a *Across) self() string { return a.s.c.cfg.Node }

// liveNodes is the live nodes by name, this node among them even when
// etcd does not answer (ok false then).
func (a *Across) liveNodes(ctx context.Context) (map[string]api.Node, bool) {
	out := map[string]api.Node{a.self(): {Name: a.self()}}
	ns, err := a.s.c.Nodes(ctx)
	if err != nil {
		a.s.c.cfg.Log.Debug("cluster: merged events or stats without the live nodes", "err", err)
		return out, false
	}
	for _, n := range ns {
		out[n.Name] = n
	}
	return out, true
}

// partStream is one node's events as a merged stream reads them.
type partStream struct {
	start  uint64
	events iter.Seq2[api.Event, error]
}

// open opens node n's own stream: this node's subscription, or another
// node's peer route. A stream whose since is no longer kept is NotFound.
func (a *Across) open(ctx context.Context, n api.Node, since uint64, hasSince bool, f service.EventFilter) (partStream, error) {
	if n.Name == a.self() {
		sub, err := a.s.SubscribeEvents(ctx, since, hasSince, f)
		if err != nil {
			return partStream{}, err
		}
		return partStream{start: sub.Start(), events: func(yield func(api.Event, error) bool) {
			defer sub.Close()
			for _, e := range sub.Backlog() {
				if !yield(e, nil) {
					return
				}
			}
			for {
				select {
				case <-ctx.Done():
					return
				case e := <-sub.C():
					if !yield(e, nil) {
						return
					}
				case <-sub.Done():
					for k := len(sub.C()); k > 0; k-- {
						if !yield(<-sub.C(), nil) {
							return
						}
					}
					yield(api.Event{}, sub.Err())
					return
				}
			}
		}}, nil
	}
	c, err := a.client(n)
	if err != nil {
		return partStream{}, err
	}
	evs, start, err := c.Peer().NodeEvents(ctx, sdk.EventFilter{Sandbox: f.Sandbox, Labels: f.Labels, Follow: true, Since: since, Kept: hasSince && since == 0})
	if err != nil {
		return partStream{}, classifySDK(err)
	}
	return partStream{start: start, events: evs}, nil
}

// classifySDK turns an SDK error into its errdefs class (a transport
// error stays in the chain: notAnswering says what it was).
func classifySDK(err error) error {
	var e *sdk.Error
	if errors.As(err, &e) {
		return errdefs.New(errdefs.Class(e.Code), "%s", e.Message)
	}
	return errdefs.Wrap(errdefs.Unavailable, err)
}

// SubscribeEvents merges the event streams of every live node (see
// httpapi.ClusterReads). A node's part follows its stream: the kept events
// after since's position for it (every kept one when since does not name
// it, with hasSince), else from now; a node that joins later, or answers
// only later, starts with a node.joined event and its events from the
// stream's start on. A node whose lease lapses, that restarts, or whose
// stream fails ends its part with a node.left event saying why; the
// stream goes on with the others.
func (a *Across) SubscribeEvents(ctx context.Context, since api.Positions, hasSince bool, f service.EventFilter) (service.Subscription, api.Positions, error) {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unuse := a.use()
	m := &merged{a: a, unuse: unuse, f: f, began: time.Now(), hasSince: hasSince, ctx: mctx, cancel: cancel,
		c: make(chan api.Event, mergedBuffer), done: make(chan struct{}),
		parts: map[string]*part{}, pos: api.Positions{}, down: map[string]bool{}}
	for n, s := range since {
		m.pos[n] = s
	}
	nodes, _ := a.liveNodes(ctx)
	// Each node's part opens now, together, each within the wait: the
	// answer's start header names where each begins.
	type opened struct {
		p   *part
		n   api.Node
		ps  partStream
		err error
		why string
	}
	var wg sync.WaitGroup
	res := make([]opened, 0, len(nodes))
	var rmu sync.Mutex
	for _, n := range sortedNodes(nodes) {
		p := m.newPart(n)
		if why := a.silentNow(n.Name); why != "" && n.Name != a.self() {
			// Found silent by a probe just now: not waited for (the
			// watch opens it once it answers).
			m.mu.Lock()
			p.why = why
			m.mu.Unlock()
			p.cancel()
			rmu.Lock()
			res = append(res, opened{p: p, n: n, err: errors.New(why)})
			rmu.Unlock()
			continue
		}
		wg.Go(func() {
			ps, why, err := m.openPart(p, n, false)
			rmu.Lock()
			res = append(res, opened{p, n, ps, err, why})
			rmu.Unlock()
		})
	}
	wg.Wait()
	start := api.Positions{}
	slices.SortFunc(res, func(x, y opened) int { return strings.Compare(x.p.node, y.p.node) })
	for _, o := range res {
		if o.err != nil {
			if o.p.node == a.self() {
				// This node's own stream: its error is the answer's
				// (a since no longer kept, a bad filter).
				cancel()
				m.wg.Wait()
				m.end(nil)
				return nil, nil, o.err
			}
			m.failed(o.p, m.openFailed(o.p, o.n, o.err))
			continue
		}
		start[o.p.node] = o.ps.start
		if o.why != "" {
			m.tell(api.Event{Type: api.EventNodeJoined, Node: o.p.node, Time: time.Now().UTC(), Reason: o.why})
		}
		m.run(o.p, o.n, o.ps, time.Time{})
	}
	m.wg.Add(1)
	go m.watch()
	go func() {
		<-mctx.Done()
		m.wg.Wait()
		m.end(nil)
	}()
	return m, start, nil
}

// merged is a merged event stream: one part per node, each feeding c.
type merged struct {
	a        *Across
	unuse    func() // the prober's count of open streams
	f        service.EventFilter
	began    time.Time
	hasSince bool
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the parts and the watch

	c    chan api.Event
	done chan struct{}
	once sync.Once
	err  error // set before done closes

	mu    sync.Mutex
	parts map[string]*part // by node; guarded by mu
	pos   api.Positions    // the last seq sent of each node; guarded by mu
	down  map[string]bool  // nodes whose part ended and that are not back; guarded by mu
}

// part is one node's part of a merged stream.
type part struct {
	node   string
	joined time.Time // the node's JoinedAt: a restarted node is another part
	ctx    context.Context
	cancel context.CancelFunc
	why    string // why it was ended from outside; guarded by merged.mu
	// running is whether its stream is open (an opening one is bounded
	// by the wait already), seen when it opened or its last event came:
	// a probe begun before then that found its node silent does not end
	// it; guarded by merged.mu.
	running bool
	seen    time.Time
}

func (m *merged) newPart(n api.Node) *part {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &part{node: n.Name, joined: n.JoinedAt, ctx: ctx, cancel: cancel}
	m.mu.Lock()
	m.parts[n.Name] = p
	m.mu.Unlock()
	return p
}

// openPart opens p's stream from where the merged stream stands on its
// node: after the last event sent of it; else, for a part opened after
// the stream began (later) or a stream that replays (hasSince), from every
// kept event (the caller drops those before the stream's start when it
// did not replay); else from now. why, when set, is said in a node.joined
// event (where the part begins, when that is not plain).
func (m *merged) openPart(p *part, n api.Node, later bool) (partStream, string, error) {
	m.mu.Lock()
	last, known := m.pos[n.Name]
	m.mu.Unlock()
	since, hasSince := last, known || m.hasSince || later
	var ps partStream
	var err error
	m.bounded(p, n, func(ctx context.Context) { ps, err = m.a.open(ctx, n, since, hasSince, m.f) })
	if errdefs.IsNotFound(err) && known && since > 0 {
		// Its events after since are no longer kept: it restarted, or
		// the stream fell too far behind. Every kept one follows.
		m.bounded(p, n, func(ctx context.Context) { ps, err = m.a.open(ctx, n, 0, true, m.f) })
		if err == nil {
			return ps, fmt.Sprintf("node %s no longer keeps its events after seq %d (it restarted, or they were too many): those are lost; its kept events follow", n.Name, since), nil
		}
	}
	return ps, "", err
}

// bounded runs an open of p within the stream's wait: a node that does
// not answer in time is given up (its part's context ends).
func (m *merged) bounded(p *part, n api.Node, open func(ctx context.Context)) {
	t0 := time.Now()
	t := time.AfterFunc(m.a.wait, p.cancel)
	open(p.ctx)
	if !t.Stop() && p.ctx.Err() != nil && m.ctx.Err() == nil && n.Name != m.a.self() {
		// Silent: the streams that open meanwhile do not wait for it.
		m.a.noteSilent(n, t0, errNoAnswer{m.a.wait})
		m.mu.Lock()
		if p.why == "" {
			p.why = silentWords(n, errNoAnswer{m.a.wait})
		}
		m.mu.Unlock()
	}
}

// openFailed says why p's part (of node n) did not open with err.
func (m *merged) openFailed(p *part, n api.Node, err error) string {
	m.mu.Lock()
	why := p.why
	m.mu.Unlock()
	switch {
	case why != "":
		return why
	case isTransport(err):
		m.a.s.c.cfg.Log.Info("cluster: a node's event stream does not open", "node", n.Name, "addr", n.Addr, "err", err)
		return silentWords(n, err)
	default:
		return fmt.Sprintf("node %s at %s refused its event stream: %v", n.Name, n.Addr, err)
	}
}

// run follows p's stream until it ends, then says so (node.left). Events
// before notBefore (a part opened from every kept event because its node
// is new to the stream) are not sent.
func (m *merged) run(p *part, n api.Node, ps partStream, notBefore time.Time) {
	m.mu.Lock()
	p.running, p.seen = true, time.Now()
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		var err error
		for e, rerr := range ps.events {
			if rerr != nil {
				err = rerr
				break
			}
			if !notBefore.IsZero() && e.Seq != 0 && e.Time.Before(notBefore) {
				continue
			}
			e.Node = p.node
			if !m.send(e) {
				p.cancel()
				return
			}
			m.mu.Lock()
			p.seen = time.Now()
			if e.Seq != 0 {
				m.pos[p.node] = e.Seq
			}
			m.mu.Unlock()
		}
		p.cancel()
		if m.ctx.Err() != nil {
			return // the stream ended
		}
		m.mu.Lock()
		why := p.why
		m.mu.Unlock()
		switch {
		case why != "":
		case isTransport(err):
			why = m.streamCut(n, err)
		case err != nil:
			why = fmt.Sprintf("node %s at %s ended its event stream with an error: %v", p.node, n.Addr, err)
		default:
			why = fmt.Sprintf("node %s at %s ended its event stream (it stopped)", p.node, n.Addr)
		}
		m.failed(p, why)
	}()
}

// streamCut says why node n's stream ended with the transport error err
// (logged: the SDK's words are not the cluster's), with whether its lease
// lives: a node killed or cut off keeps its lease until it lapses.
func (m *merged) streamCut(n api.Node, err error) string {
	m.a.s.c.cfg.Log.Info("cluster: a node's event stream was cut", "node", n.Name, "addr", n.Addr, "err", err)
	ctx, cancel := context.WithTimeout(m.ctx, m.a.wait)
	defer cancel()
	now, live, lerr := m.a.s.c.node(ctx, n.Name)
	switch {
	case lerr != nil:
		return fmt.Sprintf("%s; its lease could not be read (etcd does not answer): its events are held until it answers again", notAnswering(n, err))
	case !live:
		return fmt.Sprintf("%s and its lease lapsed (it left the cluster): its events end here", notAnswering(n, err))
	case !now.JoinedAt.Equal(n.JoinedAt):
		return fmt.Sprintf("%s and joined again at %s (it restarted): its part starts anew", notAnswering(n, err), now.JoinedAt.UTC().Format(time.RFC3339))
	default:
		return silentWords(n, err)
	}
}

// failed ends p's part with a node.left event (once while the node
// stays away); the watch opens a new part when it is back.
func (m *merged) failed(p *part, why string) {
	m.mu.Lock()
	if m.parts[p.node] == p {
		delete(m.parts, p.node)
	}
	told := m.down[p.node]
	m.down[p.node] = true
	m.mu.Unlock()
	if !told {
		m.send(api.Event{Type: api.EventNodeLeft, Node: p.node, Time: time.Now().UTC(), Reason: why})
	}
}

// tell queues one of the stream's own events.
func (m *merged) tell(e api.Event) { m.send(e) }

// send queues e for the client. A client that leaves the buffer full
// for the slow period is cut off: it resumes from its positions.
func (m *merged) send(e api.Event) bool {
	select {
	case m.c <- e:
		return true
	case <-m.ctx.Done():
		return false
	default:
	}
	t := time.NewTimer(m.a.slow)
	defer t.Stop()
	select {
	case m.c <- e:
		return true
	case <-m.ctx.Done():
		return false
	case <-t.C:
		m.end(errdefs.New(errdefs.Unavailable, "merged event stream: the client read nothing for %s with %d events waiting and was cut off: resume with since=NODE:SEQ,... (each node's last seq received)", m.a.slow, mergedBuffer))
		return false
	}
}

// watch follows the live nodes: a node that left (or restarted) ends its
// part, a node without a part (new, back, or its part failed) gets one.
func (m *merged) watch() {
	defer m.wg.Done()
	t := time.NewTicker(m.a.poll)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		nodes, ok := m.a.liveNodes(m.ctx)
		if !ok {
			continue // etcd out of reach: the parts stay as they are
		}
		m.mu.Lock()
		var starts []api.Node
		for name, p := range m.parts {
			n, live := nodes[name]
			switch {
			case name == m.a.self():
			case !live:
				p.why = fmt.Sprintf("node %s left the cluster (its lease lapsed, or it stopped): its events end here", name)
				p.cancel()
			case !n.JoinedAt.Equal(p.joined):
				p.why = fmt.Sprintf("node %s joined again at %s (it restarted): its part ends here and starts anew", name, n.JoinedAt.UTC().Format(time.RFC3339))
				p.cancel()
			}
		}
		// A node the daemon's prober found silent (it accepts connections
		// and answers nothing, or refuses them, its lease live) has its
		// part ended like one that left, unless the part opened or an
		// event of it came after that probe began (a probe's connection
		// can fail after the node is back); the others' parts never wait
		// on it. Its part opens again once the prober finds it answers.
		for name, p := range m.parts {
			if _, live := nodes[name]; !live || name == m.a.self() || !p.running || p.ctx.Err() != nil {
				continue
			}
			if s, ok := m.a.silentSince(name); ok && !p.seen.After(s.at) {
				if p.why == "" {
					p.why = s.why
				}
				p.cancel()
			}
		}
		for _, n := range sortedNodes(nodes) {
			if _, ok := m.parts[n.Name]; !ok && (n.Name == m.a.self() || m.a.silentNow(n.Name) == "") {
				starts = append(starts, n)
			}
		}
		m.mu.Unlock()
		for _, n := range starts {
			p := m.newPart(n)
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.mu.Lock()
				_, known := m.pos[n.Name]
				wasDown := m.down[n.Name]
				m.mu.Unlock()
				ps, why, err := m.openPart(p, n, true)
				if err != nil {
					if m.ctx.Err() == nil {
						m.failed(p, m.openFailed(p, n, err))
					}
					return
				}
				var notBefore time.Time
				if why == "" {
					switch {
					case known:
						why = fmt.Sprintf("node %s answers again: its events follow from its last one sent", n.Name)
					case m.hasSince:
						why = fmt.Sprintf("node %s joined the stream: its kept events follow", n.Name)
					default:
						why = fmt.Sprintf("node %s joined the stream: its events since the stream began follow", n.Name)
						notBefore = m.began
					}
					if wasDown && !known && !m.hasSince {
						why = fmt.Sprintf("node %s answers again: its events since the stream began follow", n.Name)
					}
				}
				m.mu.Lock()
				m.down[n.Name] = false
				m.mu.Unlock()
				m.a.answered(n.Name)
				m.send(api.Event{Type: api.EventNodeJoined, Node: n.Name, Time: time.Now().UTC(), Reason: why})
				m.run(p, n, ps, notBefore)
			}()
		}
	}
}

// answered forgets that node was found silent: it answers.
func (a *Across) answered(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.silent, node)
}

// silentNow is why node was found silent by a probe within silentFor
// ("" if it was not).
func (a *Across) silentNow(node string) string {
	s, _ := a.silentSince(node)
	return s.why
}

// silentSince is the probe within silentFor that found node silent.
func (a *Across) silentSince(node string) (silence, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.silent[node]
	if !ok || time.Since(s.at) > silentFor {
		return silence{}, false
	}
	return s, true
}

func sortedNodes(nodes map[string]api.Node) []api.Node {
	out := make([]api.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b api.Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// end ends the stream (err nil: its client went) once.
func (m *merged) end(err error) {
	m.once.Do(func() {
		if m.unuse != nil {
			m.unuse()
		}
		if err == nil {
			err = errdefs.New(errdefs.Unavailable, "the merged event stream was closed")
		}
		m.err = err
		close(m.done)
		m.cancel()
	})
}

func (m *merged) Start() uint64         { return 0 } // a position per node: SubscribeEvents' start
func (m *merged) Backlog() []api.Event  { return nil }
func (m *merged) C() <-chan api.Event   { return m.c }
func (m *merged) Done() <-chan struct{} { return m.done }
func (m *merged) Err() error {
	select {
	case <-m.done:
		return m.err
	default:
		return nil
	}
}

// Close ends the stream and waits for its parts.
func (m *merged) Close() {
	m.cancel()
	m.wg.Wait()
	m.end(nil)
}

// EventsSince is every live node's kept events after since's position for
// it (every kept one when since does not name it), merged by time. A node
// that does not answer within the wait is said in a node.left event at
// the end; a position no longer kept replays the node's kept events after
// a node.joined event saying so.
func (a *Across) EventsSince(ctx context.Context, since api.Positions, f service.EventFilter) ([]api.Event, error) {
	nodes, _ := a.liveNodes(ctx)
	type got struct {
		evs  []api.Event
		note *api.Event
		err  error
	}
	res := map[string]*got{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range sortedNodes(nodes) {
		wg.Go(func() {
			g := &got{}
			wctx, cancel := context.WithTimeout(ctx, a.wait)
			defer cancel()
			from := since[n.Name]
			g.evs, g.err = a.kept(wctx, n, from, f)
			if errdefs.IsNotFound(g.err) && from > 0 {
				g.evs, g.err = a.kept(wctx, n, 0, f)
				g.note = &api.Event{Type: api.EventNodeJoined, Node: n.Name, Time: time.Now().UTC(),
					Reason: fmt.Sprintf("node %s no longer keeps its events after seq %d (it restarted, or they were too many): those are lost; its kept events follow", n.Name, from)}
			}
			if g.err != nil && wctx.Err() != nil && ctx.Err() == nil {
				g.err = errNoAnswer{a.wait}
			}
			mu.Lock()
			res[n.Name] = g
			mu.Unlock()
		})
	}
	wg.Wait()
	var out, notes []api.Event
	for _, n := range sortedNodes(nodes) {
		g := res[n.Name]
		switch {
		case g.err != nil && n.Name == a.self():
			return nil, g.err
		case g.err != nil && isTransport(g.err):
			a.s.c.cfg.Log.Info("cluster: a node's kept events were not read", "node", n.Name, "addr", n.Addr, "err", g.err)
			notes = append(notes, api.Event{Type: api.EventNodeLeft, Node: n.Name, Time: time.Now().UTC(),
				Reason: fmt.Sprintf("%s: its events are not here", notAnswering(n, g.err))})
		case g.err != nil:
			notes = append(notes, api.Event{Type: api.EventNodeLeft, Node: n.Name, Time: time.Now().UTC(),
				Reason: fmt.Sprintf("node %s at %s did not send its events (%v): they are not here", n.Name, n.Addr, g.err)})
		default:
			if g.note != nil {
				out = append(out, *g.note)
			}
			for _, e := range g.evs {
				e.Node = n.Name
				out = append(out, e)
			}
		}
	}
	slices.SortStableFunc(out, func(x, y api.Event) int { return x.Time.Compare(y.Time) })
	return append(out, notes...), nil
}

// kept is node n's kept events after since (every kept one at 0).
func (a *Across) kept(ctx context.Context, n api.Node, since uint64, f service.EventFilter) ([]api.Event, error) {
	if n.Name == a.self() {
		return a.s.EventsSince(ctx, since, f)
	}
	c, err := a.client(n)
	if err != nil {
		return nil, err
	}
	evs, _, err := c.Peer().NodeEvents(ctx, sdk.EventFilter{Sandbox: f.Sandbox, Labels: f.Labels, Since: since, Kept: since == 0})
	if err != nil {
		return nil, classifySDK(err)
	}
	var out []api.Event
	for e, err := range evs {
		if err != nil {
			return nil, classifySDK(err)
		}
		if len(out) == maxKeptOfNode {
			// Another node's bytes are input: a node keeps far fewer.
			return nil, errdefs.New(errdefs.Unavailable, "it sent more than %d kept events", maxKeptOfNode)
		}
		out = append(out, e)
	}
	if err := ctx.Err(); err != nil {
		// The iterator ends quietly with ctx: what came is not all.
		return nil, err
	}
	return out, nil
}

// maxKeptOfNode bounds the kept events read of another node (each keeps
// its last events.DefaultRing).
const maxKeptOfNode = 16 * events.DefaultRing
