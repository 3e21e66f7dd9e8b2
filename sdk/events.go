package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
)

type (
	// Event is something that happened to a sandbox; Type is one of the
	// api.EventXxx constants.
	Event     = api.Event
	EventExec = api.EventExec
	// Positions is where a merged stream (EventFilter.Cluster) stands on
	// each node: the last seq received of each.
	Positions = api.Positions
)

// EventFilter selects and positions an event stream.
type EventFilter struct {
	// Sandbox keeps only the events of this sandbox (id, or name at the
	// time); Labels only those of sandboxes with all these labels.
	Sandbox string
	Labels  map[string]string
	// Follow keeps the stream open for new events. Without it, Events
	// yields the kept events after Since (every kept one when Since is 0)
	// and ends.
	Follow bool
	// Since replays the kept events after this seq first (the last Seq
	// received, to resume). With Follow and Since 0, the stream starts
	// with the next event, or with every kept event when Kept is set.
	Since uint64
	Kept  bool
	// Cluster, on a daemon of a cluster, merges the events of every live
	// node into one stream (GET /v1/events?cluster=true): each event says
	// its Node and has that node's Seq; a node's part ends with an
	// api.EventNodeLeft event and a node picked up later starts with
	// api.EventNodeJoined. A daemon outside a cluster answers its own
	// stream. A merged stream is resumed from a position per node: the
	// iterator does it itself; Positions resumes one in a new call (a
	// node it does not name replays every event it keeps), Since 0 with
	// Kept (or without Follow) replays every node's kept events.
	Cluster   bool
	Positions Positions
}

// resumeFor bounds how long a followed stream keeps trying to reconnect
// after losing the daemon (a restart) before it yields the error.
const resumeFor = 15 * time.Second

// Events opens the daemon's event stream. It returns once the daemon
// answered, so every event after that is in the stream; the error is for
// a bad filter (invalid argument) or, with Since, for events no longer
// kept (IsNotFound: list the sandboxes again and follow from now).
//
// Ranging over the iterator yields the events in order. A followed stream
// that breaks (the daemon cut off a slow reader, or restarted) is resumed
// from the last event received, with nothing lost or repeated; when that
// cannot be done it yields the error (IsNotFound when events were lost)
// and ends. It ends without an error when ctx ends or the loop breaks.
func (c *Client) Events(ctx context.Context, f EventFilter) (iter.Seq2[Event, error], error) {
	seq, _, err := followEvents(ctx, c, "/v1/events", f)
	return seq, err
}

// followEvents opens the event stream at path and returns its iterator
// (see Events) and, for a followed stream, the Clade-Events-Start header.
func followEvents(ctx context.Context, c *Client, path string, f EventFilter) (iter.Seq2[Event, error], string, error) {
	cur := cursor{last: f.Since, pos: Positions{}}
	for n, s := range f.Positions {
		cur.pos[n] = s
	}
	if f.Cluster && f.Positions == nil && f.Since != 0 {
		cur.pos[""] = f.Since // a daemon outside a cluster: its events have no node
	}
	var first url.Values
	switch {
	case f.Cluster && f.Positions != nil:
		first = eventsQuery(f, f.Positions.String())
	case f.Since != 0 || f.Kept || !f.Follow:
		first = eventsQuery(f, strconv.FormatUint(f.Since, 10))
	default:
		first = eventsQuery(f, "")
	}
	body, start, err := openEvents(ctx, c, path, first)
	if err != nil {
		return nil, "", err
	}
	// A merged stream's start is a position per node; a daemon outside
	// a cluster answers its own stream, with one seq (and its events no
	// node: the cursor's node "").
	cur.merged = f.Cluster
	perNode := f.Cluster && (f.Positions != nil || strings.Contains(start, ":"))
	var startPos Positions
	if perNode {
		startPos, _ = api.ParsePositions(start)
	}
	startSeq, _ := strconv.ParseUint(start, 10, 64)
	return func(yield func(Event, error) bool) {
		for {
			err := readEvents(body, &cur, yield)
			body.Close()
			if errors.Is(err, errStop) || ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrCorruptEvents) {
				// Not a cut to resume from: the sender's bytes are bad.
				yield(Event{}, err)
				return
			}
			if !f.Follow {
				if err != nil {
					yield(Event{}, err)
				}
				return
			}
			var q url.Values
			if perNode {
				// Nodes nothing was received of resume from where their
				// part began.
				pos := Positions{}
				for n, s := range startPos {
					pos[n] = s
				}
				for n, s := range cur.pos {
					if n != "" {
						pos[n] = s
					}
				}
				q = eventsQuery(f, pos.String())
			} else {
				from := cur.last
				if cur.merged {
					from = cur.pos[""]
				}
				if from == 0 && !f.Kept {
					from = startSeq // nothing received yet: from where the stream began
				}
				q = eventsQuery(f, strconv.FormatUint(from, 10))
			}
			if body, err = resumeEvents(ctx, c, path, q); err != nil {
				if ctx.Err() == nil {
					yield(Event{}, err)
				}
				return
			}
		}
	}, start, nil
}

// cursor is where a stream stands: the last seq yielded, or in a merged
// stream the last of each node.
type cursor struct {
	merged bool
	last   uint64
	pos    Positions
}

// fresh reports whether e was not yielded yet, and moves the cursor past
// it.
func (c *cursor) fresh(e Event) bool {
	if c.merged {
		if e.Seq == 0 {
			return true // a merged stream's own (node.joined, node.left)
		}
		if last, ok := c.pos[e.Node]; ok && e.Seq <= last {
			return false
		}
		c.pos[e.Node] = e.Seq
		return true
	}
	if e.Seq <= c.last && c.last != 0 {
		return false // never yield one twice
	}
	c.last = e.Seq
	return true
}

// ErrCorruptEvents is an event stream's error when its bytes are no
// events (not JSON, or one event over maxEventBytes): such a stream is not
// resumed.
var ErrCorruptEvents = errors.New("corrupt event stream")

// maxEventBytes bounds one event of a stream (an event is at most a few
// MiB: requests are bounded to 1 MiB), so that a sender of an endless one
// is not held in memory.
const maxEventBytes = 16 << 20

var errEventTooBig = errors.New("event too big")

// eventLimit reads at most left bytes from r (errEventTooBig after).
type eventLimit struct {
	r    io.Reader
	left int64
}

func (l *eventLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errEventTooBig
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// errStop is readEvents' answer when the consumer stopped.
var errStop = errors.New("stopped")

// readEvents yields the events of one answer, keeping cur current. It
// returns nil at the answer's end, the error line's error, errStop when
// the consumer stopped, or the read error.
func readEvents(body io.Reader, cur *cursor, yield func(Event, error) bool) error {
	lr := &eventLimit{r: body}
	dec := json.NewDecoder(lr)
	for {
		var e Event
		lr.left = maxEventBytes
		if err := dec.Decode(&e); err != nil {
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			switch {
			case err == io.EOF:
				return nil
			case errors.Is(err, errEventTooBig):
				return fmt.Errorf("%w: an event of more than %d bytes", ErrCorruptEvents, maxEventBytes)
			case errors.As(err, &se) || errors.As(err, &te):
				return fmt.Errorf("%w: %v", ErrCorruptEvents, err)
			}
			return err
		}
		if e.Error != nil {
			return &Error{Code: e.Error.Code, Message: e.Error.Message}
		}
		if !cur.fresh(e) {
			continue
		}
		if !yield(e, nil) {
			return errStop
		}
	}
}

// resumeEvents reconnects a followed stream with query q, retrying while
// the daemon is unreachable for up to resumeFor.
func resumeEvents(ctx context.Context, c *Client, path string, q url.Values) (io.ReadCloser, error) {
	deadline := time.Now().Add(resumeFor)
	wait := 50 * time.Millisecond
	for {
		body, _, err := openEvents(ctx, c, path, q)
		if err == nil {
			return body, nil
		}
		// The daemon's answers end it, unless they say to retry; a
		// transport failure (a daemon restarting) is retried.
		var de *Error
		if errors.As(err, &de) && !IsUnavailable(err) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// eventsQuery is f's query with since (none when empty).
func eventsQuery(f EventFilter, since string) url.Values {
	q := url.Values{}
	q.Set("follow", strconv.FormatBool(f.Follow))
	if since != "" {
		q.Set("since", since)
	}
	if f.Cluster {
		q.Set("cluster", "true")
	}
	if f.Sandbox != "" {
		q.Set("sandbox", f.Sandbox)
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	return q
}

// openEvents sends GET path?q and returns the answer's body and, for a
// followed stream, the Clade-Events-Start header.
func openEvents(ctx context.Context, c *Client, path string, q url.Values) (io.ReadCloser, string, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, "", err
	}
	return resp.Body, resp.Header.Get(api.EventsStartHeader), nil
}

// NodeEvents follows the node's own events (a cluster's nodes merge
// each other's streams through it): f as for Events, without Cluster.
// start is the seq the stream starts after (its Clade-Events-Start).
func (p Peer) NodeEvents(ctx context.Context, f EventFilter) (events iter.Seq2[Event, error], start uint64, err error) {
	f.Cluster, f.Positions = false, nil
	seq, s, err := followEvents(ctx, p.c, "/v1/internal/events", f)
	if err != nil {
		return nil, 0, err
	}
	start, _ = strconv.ParseUint(s, 10, 64)
	return seq, start, nil
}

// NodeStats reads the use of the node's own sandboxes with labels (every
// one without).
func (p Peer) NodeStats(ctx context.Context, labels map[string]string) ([]SandboxStats, error) {
	q := url.Values{}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	req, err := p.c.newRequest(ctx, http.MethodGet, "/v1/internal/stats?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.c.do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// Another node's answer is input: bounded, not held whole however
	// long it is.
	lr := &eventLimit{r: resp.Body, left: maxNodeStatsBytes}
	var out []SandboxStats
	if err := json.NewDecoder(lr).Decode(&out); err != nil {
		if errors.Is(err, errEventTooBig) {
			return nil, fmt.Errorf("the node's stats answer is over %d bytes", maxNodeStatsBytes)
		}
		return nil, err
	}
	return out, nil
}

// maxNodeStatsBytes bounds a node's stats answer (a few hundred bytes a
// sandbox).
const maxNodeStatsBytes = 64 << 20

// ParsePositions reads a merged stream's position, NODE:SEQ,NODE:SEQ,...
func ParsePositions(s string) (Positions, error) { return api.ParsePositions(s) }
