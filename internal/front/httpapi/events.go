package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// eventsQuery is a parsed GET /v1/events query.
type eventsQuery struct {
	follow   bool
	since    uint64
	hasSince bool
	filter   service.EventFilter
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
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return eq, errdefs.New(errdefs.InvalidArgument, "since=%q: give the seq of the last event received (a whole number), or 0 for every kept event", v)
		}
		eq.since, eq.hasSince = n, true
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
// ?since=, then (unless ?follow=false) the new ones as they happen.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	eq, err := parseEventsQuery(r)
	if err != nil {
		return err
	}
	if !eq.follow {
		since := eq.since // without since: every kept event
		evs, err := s.svc.EventsSince(r.Context(), since, eq.filter)
		if err != nil {
			return err
		}
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
	sub, err := s.svc.SubscribeEvents(r.Context(), eq.since, eq.hasSince, eq.filter)
	if err != nil {
		return err
	}
	defer sub.Close()
	rc := http.NewResponseController(w)
	w.Header().Set(api.EventsStartHeader, strconv.FormatUint(sub.Start(), 10))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	// The headers go out now: a client that has them sees every later event.
	if err := rc.Flush(); err != nil {
		return nil
	}
	enc := json.NewEncoder(w)
	send := func(e api.Event) bool {
		return enc.Encode(e) == nil
	}
	for _, e := range sub.Backlog() {
		if !send(e) {
			return nil
		}
	}
	if rc.Flush() != nil {
		return nil
	}
	for {
		select {
		case <-r.Context().Done():
			return nil
		case e := <-sub.C():
			if !send(e) {
				return nil
			}
			// Send what else is queued before flushing.
			for n := len(sub.C()); n > 0; n-- {
				if !send(<-sub.C()) {
					return nil
				}
			}
			if rc.Flush() != nil {
				return nil
			}
		case <-sub.Done():
			// Cut off: pass on what it had received, then say why.
			for n := len(sub.C()); n > 0; n-- {
				if !send(<-sub.C()) {
					return nil
				}
			}
			err := sub.Err()
			_ = enc.Encode(api.Event{Error: &api.Error{Code: string(errdefs.ClassOf(err)), Message: err.Error()}})
			_ = rc.Flush()
			return nil
		}
	}
}
