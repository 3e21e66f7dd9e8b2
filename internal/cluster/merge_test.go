package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// chanLocal is a node's own service with only an event stream: what the
// test sends on c.
type chanLocal struct {
	service.Service
	c chan api.Event
}

type chanSub struct {
	c    chan api.Event
	done chan struct{}
	once sync.Once
}

func (l *chanLocal) SubscribeEvents(ctx context.Context, since uint64, hasSince bool, f service.EventFilter) (service.Subscription, error) {
	s := &chanSub{c: make(chan api.Event, 16), done: make(chan struct{})}
	go func() {
		for {
			select {
			case e := <-l.c:
				select {
				case s.c <- e:
				case <-s.done:
					return
				}
			case <-s.done:
				return
			}
		}
	}()
	return s, nil
}

func (s *chanSub) Start() uint64         { return 5 }
func (s *chanSub) Backlog() []api.Event  { return nil }
func (s *chanSub) C() <-chan api.Event   { return s.c }
func (s *chanSub) Done() <-chan struct{} { return s.done }
func (s *chanSub) Err() error            { return errdefs.New(errdefs.Unavailable, "closed") }
func (s *chanSub) Close()                { s.once.Do(func() { close(s.done) }) }

// peerNode is another node's API as a merged stream reads it: its own
// events (GET /v1/internal/events), from a backlog and then c; queries
// are the queries it got.
type peerNode struct {
	srv     *httptest.Server
	c       chan api.Event
	backlog []api.Event
	mu      sync.Mutex
	queries []string
	quiet   chan struct{} // while set, the node answers nothing (closed when it answers again); guarded by mu
}

// silence makes the node accept connections and answer nothing, its
// open streams included (on), or answer again (off).
func (p *peerNode) silence(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.quiet == nil:
		p.quiet = make(chan struct{})
	case !on && p.quiet != nil:
		close(p.quiet)
		p.quiet = nil
	}
}

// hold waits while the node is silent: false when the request ended.
func (p *peerNode) hold(r *http.Request) bool {
	p.mu.Lock()
	q := p.quiet
	p.mu.Unlock()
	if q == nil {
		return true
	}
	select {
	case <-q:
		return true
	case <-r.Context().Done():
		return false
	}
}

func newPeerNode(t *testing.T, backlog ...api.Event) *peerNode {
	p := &peerNode{c: make(chan api.Event, 16), backlog: backlog}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.hold(r) {
			return
		}
		if r.URL.Path != "/v1/internal/events" || r.Header.Get("Authorization") != "Bearer cluster-secret" {
			http.Error(w, `{"code":"not_found","message":"no"}`, http.StatusNotFound)
			return
		}
		p.mu.Lock()
		p.queries = append(p.queries, r.URL.RawQuery)
		p.mu.Unlock()
		w.Header().Set(api.EventsStartHeader, "100")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		if r.URL.Query().Get("since") == "0" {
			for _, e := range p.backlog {
				_ = enc.Encode(e)
			}
		}
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case e := <-p.c:
				if !p.hold(r) {
					p.c <- e // not sent: the next stream's
					return
				}
				_ = enc.Encode(e)
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *peerNode) query(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i >= len(p.queries) {
		return ""
	}
	return p.queries[i]
}

func joinAt(t *testing.T, cli *clientv3.Client, name, addr string) *Cluster {
	t.Helper()
	c, err := Join(t.Context(), cli, Config{Node: name, Addr: addr, LeaseTTL: 2 * time.Second, Token: "cluster-secret"})
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	return c
}

// TestMergeParts: a merged stream over an embedded etcd, this node's own
// events and other nodes' APIs on loopback. It starts with each live
// node's part (the start header names each), carries each node's events
// with its node, picks up a node that joins later (node.joined, and of its
// kept events only those since the stream began), ends the part of a node
// that leaves with node.left saying so and goes on; closed, it leaves
// nothing running.
func TestMergeParts(t *testing.T) {
	cli := startEtcd(t)
	b := newPeerNode(t)
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", b.srv.Listener.Addr().String())
	local := &chanLocal{c: make(chan api.Event, 16)}
	s := NewService(ca, local)
	a := NewAcross(s)
	a.poll = 100 * time.Millisecond
	sub, start, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if start.String() != "a:5,b:100" {
		t.Fatalf("start %s, want a:5,b:100", start)
	}
	if q := b.query(0); strings.Contains(q, "since") {
		t.Fatalf("b's part opened with %q: a new stream starts from now", q)
	}
	next := func(what string) api.Event {
		t.Helper()
		select {
		case e := <-sub.C():
			return e
		case <-sub.Done():
			t.Fatalf("%s: the stream ended: %v", what, sub.Err())
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: nothing within 30 s", what)
		}
		return api.Event{}
	}
	local.c <- api.Event{Seq: 6, Type: api.EventCreated, Sandbox: "s1"}
	if e := next("a's event"); e.Node != "a" || e.Seq != 6 || e.Sandbox != "s1" {
		t.Fatalf("a's event: %+v", e)
	}
	b.c <- api.Event{Seq: 101, Type: api.EventCreated, Sandbox: "s2", Time: time.Now()}
	if e := next("b's event"); e.Node != "b" || e.Seq != 101 || e.Sandbox != "s2" {
		t.Fatalf("b's event: %+v", e)
	}

	// c joins: picked up, its kept events since the stream began only.
	old := api.Event{Seq: 40, Type: api.EventCreated, Sandbox: "before", Time: time.Now().Add(-time.Hour)}
	c := newPeerNode(t, old, api.Event{Seq: 41, Type: api.EventCreated, Sandbox: "after", Time: time.Now()})
	cc := joinAt(t, cli, "c", c.srv.Listener.Addr().String())
	defer cc.Close()
	if e := next("c joined"); e.Type != api.EventNodeJoined || e.Node != "c" || e.Seq != 0 || !strings.Contains(e.Reason, "since the stream began") {
		t.Fatalf("c joined: %+v", e)
	}
	if e := next("c's kept event"); e.Node != "c" || e.Sandbox != "after" {
		t.Fatalf("c's kept event: %+v (the one before the stream began must not come)", e)
	}
	if q := c.query(0); !strings.Contains(q, "since=0") {
		t.Fatalf("c's part opened with %q, want since=0", q)
	}

	// b leaves: its part ends, saying so; the others go on.
	cb.Close()
	if e := next("b left"); e.Type != api.EventNodeLeft || e.Node != "b" || !strings.Contains(e.Reason, "left the cluster") {
		t.Fatalf("b left: %+v", e)
	}
	c.c <- api.Event{Seq: 42, Type: api.EventRemoved, Sandbox: "after", Time: time.Now()}
	if e := next("c's event after b left"); e.Node != "c" || e.Seq != 42 {
		t.Fatalf("c's event after b left: %+v", e)
	}
	sub.Close()
	select {
	case <-sub.Done():
	default:
		t.Fatal("closed, the stream is not done")
	}
}

// TestEventsSinceFlooded: a node that answers a read of its kept events
// with events that do not end (a peer's garbage) is cut off after a
// bounded count, said in its node.left, and the others' events come: it
// was read, and held, until the wait ran out.
func TestEventsSinceFlooded(t *testing.T) {
	cli := startEtcd(t)
	flood := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.EventsStartHeader, "0")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		for i := uint64(1); r.Context().Err() == nil; i++ {
			if enc.Encode(api.Event{Seq: i, Type: api.EventCreated, Sandbox: "s"}) != nil {
				return
			}
		}
	}))
	defer flood.Close()
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", flood.Listener.Addr().String())
	defer cb.Close()
	s := NewService(ca, &keptLocal{})
	a := NewAcross(s)
	a.wait = 60 * time.Second
	t0 := time.Now()
	evs, err := a.EventsSince(t.Context(), api.Positions{}, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if len(evs) != 1 || evs[0].Type != api.EventNodeLeft || evs[0].Node != "b" || !strings.Contains(evs[0].Reason, "more than") {
		t.Fatalf("%d events, the last %+v: want b's node.left saying it sent too many", len(evs), evs[len(evs)-1])
	}
	if took > a.wait/2 {
		t.Fatalf("took %s (the wait is %s)", took, a.wait)
	}
	t.Logf("%s: %s", took, evs[0].Reason)
}

// keptLocal is a node's own service without kept events.
type keptLocal struct{ service.Service }

func (keptLocal) EventsSince(context.Context, uint64, service.EventFilter) ([]api.Event, error) {
	return nil, nil
}

// TestEventsSinceCutByWait: a node whose kept events do not all come
// within the wait is said in a node.left, not answered with the part that
// came as if it were all of them.
func TestEventsSinceCutByWait(t *testing.T) {
	cli := startEtcd(t)
	gone := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.EventsStartHeader, "0")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(api.Event{Seq: 1, Type: api.EventCreated, Sandbox: "s"})
		w.(http.Flusher).Flush()
		select { // the rest never comes
		case <-r.Context().Done():
		case <-gone:
		}
	}))
	defer slow.Close()
	defer close(gone)
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", slow.Listener.Addr().String())
	defer cb.Close()
	a := NewAcross(NewService(ca, &keptLocal{}))
	a.wait = time.Second
	evs, err := a.EventsSince(t.Context(), api.Positions{}, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Type != api.EventNodeLeft || evs[0].Node != "b" || !strings.Contains(evs[0].Reason, "within") {
		t.Fatalf("events %+v: want only b's node.left saying it did not answer within the wait", evs)
	}
}

// TestMergeSilentNode: a node whose lease lives but whose API accepts
// connections and answers nothing (its open stream included) does not
// hold back the others: their events come while it is silent, its part
// ends with a node.left saying it does not answer, and once it answers
// again its part starts anew (node.joined) from its last event sent, so
// that the event it had while silent comes. A stream opened while the node
// is known silent answers at once, without waiting on it.
func TestMergeSilentNode(t *testing.T) {
	cli := startEtcd(t)
	b := newPeerNode(t)
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", b.srv.Listener.Addr().String())
	defer cb.Close()
	local := &chanLocal{c: make(chan api.Event, 16)}
	a := NewAcross(NewService(ca, local))
	a.poll, a.wait = 100*time.Millisecond, 2*time.Second
	sub, start, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if start.String() != "a:5,b:100" {
		t.Fatalf("start %s, want a:5,b:100", start)
	}
	next := func(what string, within time.Duration) api.Event {
		t.Helper()
		select {
		case e := <-sub.C():
			return e
		case <-sub.Done():
			t.Fatalf("%s: the stream ended: %v", what, sub.Err())
		case <-time.After(within):
			t.Fatalf("%s: nothing within %s", what, within)
		}
		return api.Event{}
	}
	b.c <- api.Event{Seq: 101, Type: api.EventCreated, Sandbox: "s1", Time: time.Now()}
	if e := next("b's event", 30*time.Second); e.Node != "b" || e.Seq != 101 {
		t.Fatalf("b's event: %+v", e)
	}

	b.silence(true)
	t0 := time.Now()
	local.c <- api.Event{Seq: 6, Type: api.EventCreated, Sandbox: "s2"}
	if e := next("a's event while b is silent", 30*time.Second); e.Node != "a" || e.Seq != 6 {
		t.Fatalf("a's event while b is silent: %+v", e)
	}
	b.c <- api.Event{Seq: 102, Type: api.EventCreated, Sandbox: "s3", Time: time.Now()}
	left := next("b's node.left", 30*time.Second)
	if left.Type != api.EventNodeLeft || left.Node != "b" || !strings.Contains(left.Reason, "does not answer") || !strings.Contains(left.Reason, "lease is live") {
		t.Fatalf("b silent: %+v, want its node.left saying it does not answer", left)
	}
	t.Logf("b's part ended %s after it went silent: %s", time.Since(t0).Round(time.Millisecond), left.Reason)
	// Another stream opened now does not wait on b.
	t1 := time.Now()
	sub2, start2, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	took := time.Since(t1)
	if err != nil {
		t.Fatal(err)
	}
	if start2.String() != "a:5" || took >= a.wait/2 {
		t.Fatalf("a stream opened while b is silent: start %s after %s, want a:5 at once (the wait is %s)", start2, took, a.wait)
	}
	select {
	case e := <-sub2.C():
		if e.Type != api.EventNodeLeft || e.Node != "b" || !strings.Contains(e.Reason, "does not answer") {
			t.Fatalf("the second stream's first event: %+v, want b's node.left", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second stream says nothing of b")
	}
	sub2.Close()
	t.Logf("a stream opened while b is silent answered in %s", took.Round(time.Millisecond))
	local.c <- api.Event{Seq: 7, Type: api.EventCreated, Sandbox: "s4"}
	if e := next("a's event after b's node.left", 30*time.Second); e.Node != "a" || e.Seq != 7 {
		t.Fatalf("a's event after b's node.left: %+v", e)
	}

	b.silence(false)
	if e := next("b's node.joined", 30*time.Second); e.Type != api.EventNodeJoined || e.Node != "b" || !strings.Contains(e.Reason, "answers again") {
		t.Fatalf("b answers again: %+v", e)
	}
	if e := next("b's event from while it was silent", 30*time.Second); e.Node != "b" || e.Seq != 102 {
		t.Fatalf("b's event from while it was silent: %+v", e)
	}
	b.mu.Lock()
	last := b.queries[len(b.queries)-1]
	b.mu.Unlock()
	if !strings.Contains(last, "since=101") {
		t.Fatalf("b's part opened again with %q, want since=101 (its last event sent)", last)
	}
}

// TestMergeKnownSilent: the merged streams' probes are the daemon's. A
// node that falls silent after the last stream closed is found silent by
// the daemon's prober all the same (it goes on for a while after the last
// stream), and the next stream answers at once, without waiting on it,
// beginning with its node.left; once it answers again it is picked up.
func TestMergeKnownSilent(t *testing.T) {
	cli := startEtcd(t)
	b := newPeerNode(t)
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", b.srv.Listener.Addr().String())
	defer cb.Close()
	local := &chanLocal{c: make(chan api.Event, 16)}
	a := NewAcross(NewService(ca, local))
	a.poll, a.wait = 100*time.Millisecond, 2*time.Second
	sub, start, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if start.String() != "a:5,b:100" {
		t.Fatalf("start %s, want a:5,b:100", start)
	}
	sub.Close()

	// b falls silent with no stream open.
	b.silence(true)
	t0 := time.Now()
	for a.silentNow("b") == "" {
		if time.Since(t0) > 30*time.Second {
			t.Fatal("b silent for 30 s with no stream open: the daemon never found it silent")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
	t.Logf("b found silent %s after it fell silent, no stream open", time.Since(t0).Round(time.Millisecond))
	t1 := time.Now()
	sub2, start2, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	took := time.Since(t1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close()
	if start2.String() != "a:5" || took >= a.wait/2 {
		t.Fatalf("a stream opened with b known silent: start %s after %s, want a:5 at once (the wait is %s)", start2, took, a.wait)
	}
	next := func(what string) api.Event {
		t.Helper()
		select {
		case e := <-sub2.C():
			return e
		case <-sub2.Done():
			t.Fatalf("%s: the stream ended: %v", what, sub2.Err())
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: nothing within 30 s", what)
		}
		return api.Event{}
	}
	if e := next("b's node.left"); e.Type != api.EventNodeLeft || e.Node != "b" || !strings.Contains(e.Reason, "does not answer") || !strings.Contains(e.Reason, "lease is live") {
		t.Fatalf("the stream's first event: %+v, want b's node.left", e)
	}
	t.Logf("a stream opened with b known silent answered in %s", took.Round(time.Millisecond))
	b.silence(false)
	if e := next("b's node.joined"); e.Type != api.EventNodeJoined || e.Node != "b" || !strings.Contains(e.Reason, "answers again") {
		t.Fatalf("b answers again: %+v", e)
	}
	b.c <- api.Event{Seq: 101, Type: api.EventCreated, Sandbox: "s1", Time: time.Now()}
	if e := next("b's event"); e.Node != "b" || e.Seq != 101 {
		t.Fatalf("b's event: %+v", e)
	}
}

// TestMergeKilledNodeWords: a node killed under a merged stream (its
// connections cut, nothing listening at its address, its lease still
// live) ends its part with a node.left in the cluster's words: its name,
// its address, that it does not answer and how, and that its lease is
// live; not the SDK's words for a CLI user with a daemon of their own.
// A stream opened then says the same of it.
func TestMergeKilledNodeWords(t *testing.T) {
	cli := startEtcd(t)
	b := newPeerNode(t)
	addr := b.srv.Listener.Addr().String()
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", addr)
	defer cb.Close()
	local := &chanLocal{c: make(chan api.Event, 16)}
	a := NewAcross(NewService(ca, local))
	a.poll, a.wait = 100*time.Millisecond, 2*time.Second
	check := func(what string, sub service.Subscription) {
		t.Helper()
		for {
			select {
			case e := <-sub.C():
				if e.Type != api.EventNodeLeft {
					continue
				}
				if e.Node != "b" || !strings.Contains(e.Reason, "node b at "+addr+" does not answer") ||
					!strings.Contains(e.Reason, "lease is live") || strings.Contains(e.Reason, "clade daemon") ||
					strings.Contains(e.Reason, "CLADE_HOST") {
					t.Fatalf("%s: node.left %+v, want b's, in the cluster's words (its address %s, does not answer, its lease live)", what, e, addr)
				}
				t.Logf("%s: %s", what, e.Reason)
				return
			case <-sub.Done():
				t.Fatalf("%s: the stream ended: %v", what, sub.Err())
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no node.left of b within 30 s", what)
			}
		}
	}
	sub, start, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if start.String() != "a:5,b:100" {
		t.Fatalf("start %s, want a:5,b:100", start)
	}
	// Killed: nothing listens at its address, its streams are cut.
	b.srv.Listener.Close()
	b.srv.CloseClientConnections()
	check("the open stream", sub)
	sub2, _, err := a.SubscribeEvents(t.Context(), nil, false, service.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close()
	check("a stream opened after", sub2)
}
