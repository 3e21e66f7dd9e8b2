package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

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

// TestEventsResumeMerged: a merged stream (Cluster) keeps a position per
// node: an event of one node with a seq below another node's last is
// yielded (seqs of different nodes are not comparable), the stream's own
// events (no seq) are yielded, and a resume names each node's last seq,
// or where its part began when none of it was received.
func TestEventsResumeMerged(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		n := len(queries)
		mu.Unlock()
		w.Header().Set(api.EventsStartHeader, "n1:100,n2:5000,n3:70")
		enc := json.NewEncoder(w)
		switch n {
		case 1:
			_ = enc.Encode(api.Event{Node: "n2", Seq: 5001, Type: api.EventCreated})
			_ = enc.Encode(api.Event{Node: "n1", Seq: 101, Type: api.EventCreated})
			_ = enc.Encode(api.Event{Node: "n2", Type: api.EventNodeLeft, Reason: "its lease lapsed"})
			_ = enc.Encode(api.Event{Error: &api.Error{Code: "unavailable", Message: "cut off"}})
		case 2:
			_ = enc.Encode(api.Event{Node: "n1", Seq: 101, Type: api.EventCreated}) // again, by mistake
			_ = enc.Encode(api.Event{Node: "n1", Seq: 102, Type: api.EventStarted})
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = enc.Encode(api.Error{Code: "invalid_argument", Message: "enough"})
		}
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := c.Events(t.Context(), sdk.EventFilter{Follow: true, Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var last error
	for e, err := range evs {
		if err != nil {
			last = err
			continue
		}
		got = append(got, fmt.Sprintf("%s:%d:%s", e.Node, e.Seq, e.Type))
	}
	want := []string{"n2:5001:created", "n1:101:created", "n2:0:node.left", "n1:102:started"}
	if !slices.Equal(got, want) {
		t.Errorf("yielded %q, want %q", got, want)
	}
	if !sdk.IsInvalidArgument(last) {
		t.Errorf("the stream ended with %v, want the daemon's refusal", last)
	}
	wantQ := []string{"cluster=true&follow=true",
		"cluster=true&follow=true&since=n1%3A101%2Cn2%3A5001%2Cn3%3A70",
		"cluster=true&follow=true&since=n1%3A102%2Cn2%3A5001%2Cn3%3A70"}
	if !slices.Equal(queries, wantQ) {
		t.Errorf("queries %q, want %q", queries, wantQ)
	}
}

// TestEventsHostileStream: a stream that sends one endless event (a peer
// node's garbage, read by a merged stream) or bytes that are no JSON is
// refused with an error after a bounded read, not held in memory whole
// nor reconnected to again and again.
func TestEventsHostileStream(t *testing.T) {
	for _, c := range []struct {
		name string
		body func(w io.Writer) error
	}{
		{"endless event", func(w io.Writer) error {
			if _, err := io.WriteString(w, `{"seq":101,"type":"created","sandbox":"`); err != nil {
				return err
			}
			chunk := bytes.Repeat([]byte("a"), 1<<20)
			for range 256 {
				if _, err := w.Write(chunk); err != nil {
					return err
				}
			}
			return nil
		}},
		{"garbage", func(w io.Writer) error {
			_, err := io.WriteString(w, "{\"seq\":101,\"type\":\"created\"}\n\x00\x01 not json\n")
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			conns := 0
			var served int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				conns++
				n := conns
				mu.Unlock()
				w.Header().Set(api.EventsStartHeader, "100")
				if n > 3 {
					<-r.Context().Done() // resumed again and again: the test tells
					return
				}
				cw := &countingWriter{w: w, mu: &mu, n: &served}
				_ = c.body(cw)
			}))
			t.Cleanup(srv.Close)
			cl, err := sdk.New(srv.URL, sdk.WithToken("cluster-secret"))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			evs, _, err := cl.Peer().NodeEvents(ctx, sdk.EventFilter{Follow: true})
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for _, err := range evs {
				if err != nil {
					last = err
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if last == nil || ctx.Err() != nil {
				t.Fatalf("the stream ended with %v (ctx: %v), want an error of its own", last, ctx.Err())
			}
			if conns != 1 {
				t.Errorf("the stream was opened %d times: a corrupt stream is no cut to resume from", conns)
			}
			if served > 64<<20 {
				t.Errorf("%d MiB read of one event before it was refused", served>>20)
			}
			t.Logf("ended with: %v (%d MiB served)", last, served>>20)
		})
	}
}

type countingWriter struct {
	w  io.Writer
	mu *sync.Mutex
	n  *int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.mu.Lock()
	*c.n += int64(k)
	c.mu.Unlock()
	return k, err
}

// TestNodeStatsHostile: a node's stats answer that does not end (a peer's
// garbage) is refused after a bounded read, not held in memory whole.
func TestNodeStatsHostile(t *testing.T) {
	var mu sync.Mutex
	var served int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		cw := &countingWriter{w: w, mu: &mu, n: &served}
		if _, err := io.WriteString(cw, `[{"id":"`); err != nil {
			return
		}
		chunk := bytes.Repeat([]byte("a"), 1<<20)
		for range 256 {
			if _, err := cw.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	cl, err := sdk.New(srv.URL, sdk.WithToken("cluster-secret"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Peer().NodeStats(t.Context(), nil)
	mu.Lock()
	defer mu.Unlock()
	if err == nil {
		t.Fatal("no error")
	}
	if served > 128<<20 {
		t.Errorf("%d MiB read of one answer before it was refused", served>>20)
	}
	t.Logf("%v (%d MiB served)", err, served>>20)
}
