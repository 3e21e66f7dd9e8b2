package sdk_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/sdk"
)

// TestEventsResume: a followed stream the daemon cuts off is resumed from
// the last event received, and yields each event once, in order. The
// daemon side is scripted: what is tested is the client's logic.
func TestEventsResume(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		n := len(queries)
		mu.Unlock()
		w.Header().Set(api.EventsStartHeader, "100")
		enc := json.NewEncoder(w)
		switch n {
		case 1: // two events, then cut off
			_ = enc.Encode(api.Event{Seq: 101, Type: api.EventCreated})
			_ = enc.Encode(api.Event{Seq: 102, Type: api.EventStarted})
			_ = enc.Encode(api.Event{Error: &api.Error{Code: "unavailable", Message: "cut off"}})
		case 2: // one repeated by mistake, one new; then the connection drops
			_ = enc.Encode(api.Event{Seq: 102, Type: api.EventStarted})
			_ = enc.Encode(api.Event{Seq: 103, Type: api.EventSlept})
		default: // the rest are lost
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = enc.Encode(api.Error{Code: "not_found", Message: "events after seq 103 are no longer kept"})
		}
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	evs, err := c.Events(ctx, sdk.EventFilter{Follow: true, Sandbox: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var last error
	for e, err := range evs {
		if err != nil {
			last = err
			continue
		}
		seqs = append(seqs, e.Seq)
	}
	if !slices.Equal(seqs, []uint64{101, 102, 103}) {
		t.Errorf("yielded seqs %v, want 101 102 103, each once", seqs)
	}
	if !sdk.IsNotFound(last) {
		t.Errorf("the stream ended with %v, want the loss (not found)", last)
	}
	want := []string{"follow=true&sandbox=x", "follow=true&sandbox=x&since=102", "follow=true&sandbox=x&since=103"}
	if !slices.Equal(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
}
