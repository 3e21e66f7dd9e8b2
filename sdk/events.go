package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/clade-sandbox/clade/api"
)

type (
	// Event is something that happened to a sandbox; Type is one of the
	// api.EventXxx constants.
	Event     = api.Event
	EventExec = api.EventExec
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
	body, start, err := c.openEvents(ctx, f, f.Since, f.Since != 0 || f.Kept || !f.Follow)
	if err != nil {
		return nil, err
	}
	return func(yield func(Event, error) bool) {
		last := f.Since // the last event yielded
		for {
			err := readEvents(body, &last, yield)
			body.Close()
			if errors.Is(err, errStop) || ctx.Err() != nil {
				return
			}
			if !f.Follow {
				if err != nil {
					yield(Event{}, err)
				}
				return
			}
			from := last
			if from == 0 && !f.Kept {
				from = start // nothing received yet: from where the stream began
			}
			if body, err = c.resumeEvents(ctx, f, from); err != nil {
				if ctx.Err() == nil {
					yield(Event{}, err)
				}
				return
			}
		}
	}, nil
}

// errStop is readEvents' answer when the consumer stopped.
var errStop = errors.New("stopped")

// readEvents yields the events of one answer, keeping last current. It
// returns nil at the answer's end, the error line's error, errStop when
// the consumer stopped, or the read error.
func readEvents(body io.Reader, last *uint64, yield func(Event, error) bool) error {
	dec := json.NewDecoder(body)
	for {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if e.Error != nil {
			return &Error{Code: e.Error.Code, Message: e.Error.Message}
		}
		if e.Seq <= *last && *last != 0 {
			continue // never yield one twice
		}
		*last = e.Seq
		if !yield(e, nil) {
			return errStop
		}
	}
}

// resumeEvents reconnects a followed stream after seq last, retrying
// while the daemon is unreachable for up to resumeFor.
func (c *Client) resumeEvents(ctx context.Context, f EventFilter, last uint64) (io.ReadCloser, error) {
	deadline := time.Now().Add(resumeFor)
	wait := 50 * time.Millisecond
	for {
		body, _, err := c.openEvents(ctx, f, last, true)
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

// openEvents sends GET /v1/events and returns the answer's body and, for
// a followed stream, the seq it starts after.
func (c *Client) openEvents(ctx context.Context, f EventFilter, since uint64, withSince bool) (io.ReadCloser, uint64, error) {
	q := url.Values{}
	q.Set("follow", strconv.FormatBool(f.Follow))
	if withSince {
		q.Set("since", strconv.FormatUint(since, 10))
	}
	if f.Sandbox != "" {
		q.Set("sandbox", f.Sandbox)
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/events?"+q.Encode(), nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, 0, err
	}
	start, _ := strconv.ParseUint(resp.Header.Get(api.EventsStartHeader), 10, 64)
	return resp.Body, start, nil
}
