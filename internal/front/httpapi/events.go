package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// ClusterReads is what a node of a cluster reads across every live node
// (cluster.Across): GET /v1/events?cluster=true and GET /v1/stats.
type ClusterReads interface {
	// SubscribeEvents merges the event streams of every live node: the
	// kept events after since (with hasSince; a node since does not name
	// replays every kept one), then the new ones, each with its node.
	// start is where each node's part begins.
	SubscribeEvents(ctx context.Context, since api.Positions, hasSince bool, f service.EventFilter) (sub service.Subscription, start api.Positions, err error)
	// EventsSince is every live node's kept events after since.
	EventsSince(ctx context.Context, since api.Positions, f service.EventFilter) ([]api.Event, error)
	// ListStats reads the sandboxes of every node (as service.ListStats),
	// each with its node; a node that does not answer in time is said in
	// its sandboxes' readings (Error).
	ListStats(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error)
}

// eventsQuery is a parsed GET /v1/events query.
type eventsQuery struct {
	follow   bool
	since    uint64
	hasSince bool
	filter   service.EventFilter
	// cluster: merge every node's stream; positions is its since= (a
	// plain 0 is every node's kept events).
	cluster   bool
	positions api.Positions
}

func parseEventsQuery(r *http.Request) (eventsQuery, error) {
	q := r.URL.Query()
	eq := eventsQuery{follow: true}
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return eq, errdefs.New(errdefs.InvalidArgument, "follow=%q: give true or false", v)
		}
		eq.follow = b
	}
	if v := q.Get("cluster"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return eq, errdefs.New(errdefs.InvalidArgument, "cluster=%q: give true or false", v)
		}
		eq.cluster = b
	}
	if v := q.Get("since"); v != "" {
		if eq.cluster && strings.Contains(v, ":") {
			p, err := api.ParsePositions(v)
			if err != nil {
				return eq, errdefs.New(errdefs.InvalidArgument, "since=%.200q: %v; give NODE:SEQ,NODE:SEQ,... (each node's last seq received)", v, err)
			}
			eq.positions, eq.hasSince = p, true
		} else {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return eq, errdefs.New(errdefs.InvalidArgument, "since=%q: give the seq of the last event received (a whole number), or 0 for every kept event", v)
			}
			eq.since, eq.hasSince = n, true
		}
	}
	eq.filter.Sandbox = q.Get("sandbox")
	labels, err := labelFilter(r)
	if err != nil {
		return eq, err
	}
	eq.filter.Labels = labels
	return eq, nil
}

// events streams lifecycle events as lines of JSON: the kept ones after
// ?since=, then (unless ?follow=false) the new ones as they happen; with
// ?cluster=true on a node of a cluster, every live node's.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	return serveEvents(s, w, r, s.cfg.Cluster)
}

// nodeEvents is the node's own events for the cluster's other nodes
// (GET /v1/internal/events, which they merge).
func nodeEvents(s *Server) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error { return serveEvents(s, w, r, nil) }
}

// serveEvents answers GET /v1/events; cr, when set, merges the nodes'
// streams for ?cluster=true.
func serveEvents(s *Server, w http.ResponseWriter, r *http.Request, cr ClusterReads) error {
	eq, err := parseEventsQuery(r)
	if err != nil {
		return err
	}
	if eq.cluster && cr != nil {
		return clusterEvents(w, r, cr, eq)
	}
	if eq.positions != nil {
		// Outside a cluster there is one node: its own name is not known
		// here, so say what to give.
		return errdefs.New(errdefs.InvalidArgument, "since=NODE:SEQ positions are for a cluster's merged stream; this daemon is not part of a cluster: give since=SEQ")
	}
	if !eq.follow {
		since := eq.since // without since: every kept event
		evs, err := s.svc.EventsSince(r.Context(), since, eq.filter)
		if err != nil {
			return err
		}
		return writeEvents(w, evs)
	}
	sub, err := s.svc.SubscribeEvents(r.Context(), eq.since, eq.hasSince, eq.filter)
	if err != nil {
		return err
	}
	defer sub.Close()
	streamEvents(w, r, sub, strconv.FormatUint(sub.Start(), 10))
	return nil
}

// clusterEvents answers GET /v1/events?cluster=true on a node of a
// cluster: every live node's events, merged.
func clusterEvents(w http.ResponseWriter, r *http.Request, cr ClusterReads, eq eventsQuery) error {
	since := eq.positions
	if since == nil && eq.hasSince {
		if eq.since != 0 {
			return errdefs.New(errdefs.InvalidArgument, "since=%d: a merged stream (cluster=true) resumes from a position per node: since=NODE:SEQ,NODE:SEQ,... "+
				"(each node's last seq received; the Clade-Events-Start header gives where each began), or since=0 for every node's kept events", eq.since)
		}
		since = api.Positions{} // 0: every node's kept events
	}
	if !eq.follow {
		evs, err := cr.EventsSince(r.Context(), since, eq.filter)
		if err != nil {
			return err
		}
		return writeEvents(w, evs)
	}
	sub, start, err := cr.SubscribeEvents(r.Context(), since, eq.hasSince, eq.filter)
	if err != nil {
		return err
	}
	defer sub.Close()
	streamEvents(w, r, sub, start.String())
	return nil
}

func writeEvents(w http.ResponseWriter, evs []api.Event) error {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, e := range evs {
		if err := enc.Encode(e); err != nil {
			return nil
		}
	}
	return nil
}

// streamEvents sends sub's backlog and then its events until the client
// goes or sub ends (its error the last line); start is the
// Clade-Events-Start header.
func streamEvents(w http.ResponseWriter, r *http.Request, sub service.Subscription, start string) {
	rc := http.NewResponseController(w)
	w.Header().Set(api.EventsStartHeader, start)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	// The headers go out now: a client that has them sees every later event.
	if err := rc.Flush(); err != nil {
		return
	}
	enc := json.NewEncoder(w)
	send := func(e api.Event) bool {
		return enc.Encode(e) == nil
	}
	for _, e := range sub.Backlog() {
		if !send(e) {
			return
		}
	}
	if rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-sub.C():
			if !send(e) {
				return
			}
			// Send what else is queued before flushing.
			for n := len(sub.C()); n > 0; n-- {
				if !send(<-sub.C()) {
					return
				}
			}
			if rc.Flush() != nil {
				return
			}
		case <-sub.Done():
			// Cut off: pass on what it had received, then say why.
			for n := len(sub.C()); n > 0; n-- {
				if !send(<-sub.C()) {
					return
				}
			}
			err := sub.Err()
			_ = enc.Encode(api.Event{Error: &api.Error{Code: string(errdefs.ClassOf(err)), Message: err.Error()}})
			_ = rc.Flush()
			return
		}
	}
}
