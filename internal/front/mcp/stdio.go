package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// StdioTransport is the SDK's newline-delimited JSON transport over in and
// out, except at the end of in: the SDK ends the session there and cancels
// every request still running, so `printf '...' | clade mcp` lost the
// answer to its last request (tools/list, a run_command). Here the end of
// in is passed on only once every request read from it has been answered
// on out (or cancelled by the client's notifications/cancelled), ctx is
// done, or the session is closed.
func StdioTransport(ctx context.Context, in io.Reader, out io.Writer) mcpsdk.Transport {
	d := &drain{pending: map[string]struct{}{}, early: map[string]struct{}{}, changed: make(chan struct{})}
	return &mcpsdk.IOTransport{
		Reader: &drainReader{ctx: ctx, d: d, r: in},
		Writer: &drainWriter{d: d, w: out},
	}
}

// drain is the set of requests read and not yet answered.
type drain struct {
	mu      sync.Mutex
	pending map[string]struct{}
	// early holds answers to requests not yet counted: the SDK decodes a
	// message before the newline that ends its line reaches the drain
	// (the last line of a pipe often has none), so it may answer first.
	early   map[string]struct{}
	closed  bool
	changed chan struct{} // closed and replaced at every change
}

func (d *drain) update(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f()
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *drain) close() { d.update(func() { d.closed = true }) }

// wait returns once nothing is pending, the drain is closed or ctx is done.
func (d *drain) wait(ctx context.Context) {
	for {
		d.mu.Lock()
		done, ch := len(d.pending) == 0 || d.closed, d.changed
		d.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// maxEarly bounds the answers kept for requests not yet counted; past it
// a request could be waited for after its answer went out, until ctx ends.
const maxEarly = 1024

// message is what the drain reads of a JSON-RPC message, as the SDK reads
// it: field names match exactly (encoding/json alone would take "ID" for
// "id" where the SDK does not, and wait for an answer that never comes).
type message struct {
	ID        json.RawMessage
	Method    *string
	RequestID json.RawMessage // params.requestId
}

func parseMessage(raw json.RawMessage) (message, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return message{}, false
	}
	m := message{ID: fields["id"]}
	if rawMethod, ok := fields["method"]; ok {
		var method string
		if json.Unmarshal(rawMethod, &method) != nil {
			return message{}, false // the SDK ends the session for it
		}
		m.Method = &method
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(fields["params"], &params) == nil {
		m.RequestID = params["requestId"]
	}
	return m, true
}

// messages reads one line: a message or a batch of them. What does not
// parse is left to the SDK, which answers or ends the session for it.
func messages(line []byte) []message {
	line = bytes.TrimSpace(line)
	var raws []json.RawMessage
	if len(line) > 0 && line[0] == '[' {
		if json.Unmarshal(line, &raws) != nil {
			return nil
		}
	} else {
		raws = []json.RawMessage{line}
	}
	var out []message
	for _, raw := range raws {
		if m, ok := parseMessage(raw); ok {
			out = append(out, m)
		}
	}
	return out
}

// idKey is a JSON-RPC id as the SDK echoes it: a string, or a number cut
// to an int64 (1, 1.0 and 1.5 are one id; "1" another). Other ids the
// SDK refuses, ending the session.
func idKey(raw json.RawMessage) (string, bool) {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return "s:" + v, true
	case float64:
		return fmt.Sprintf("n:%d", int64(v)), true
	}
	return "", false
}

// sawIn records a line from the client: requests become pending, a
// cancellation ends one (the server sends no answer to it).
func (d *drain) sawIn(line []byte) {
	for _, m := range messages(line) {
		if m.Method == nil {
			continue // the client's answer to a server request
		}
		if *m.Method == "notifications/cancelled" {
			if k, ok := idKey(m.RequestID); ok {
				d.update(func() { delete(d.pending, k) })
			}
			continue
		}
		if k, ok := idKey(m.ID); ok {
			d.update(func() {
				if _, answered := d.early[k]; answered {
					delete(d.early, k)
					return
				}
				d.pending[k] = struct{}{}
			})
		}
	}
}

// sawOut records a line to the client: an answer ends its request.
func (d *drain) sawOut(line []byte) {
	for _, m := range messages(line) {
		if m.Method != nil {
			continue // a request or notification of the server's
		}
		if k, ok := idKey(m.ID); ok {
			d.update(func() {
				if _, ok := d.pending[k]; ok {
					delete(d.pending, k)
				} else if len(d.early) < maxEarly {
					d.early[k] = struct{}{}
				}
			})
		}
	}
}

// lines splits a stream into lines for f.
type lines struct{ buf []byte }

func (l *lines) feed(p []byte, f func([]byte)) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.buf = append(l.buf, p...)
			return
		}
		if len(l.buf) > 0 {
			f(append(l.buf, p[:i]...))
			l.buf = l.buf[:0]
		} else {
			f(p[:i])
		}
		p = p[i+1:]
	}
}

func (l *lines) flush(f func([]byte)) {
	if len(l.buf) > 0 {
		f(l.buf)
		l.buf = nil
	}
}

type drainReader struct {
	ctx context.Context
	d   *drain
	r   io.Reader
	l   lines
}

func (r *drainReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	// Requests are counted before the SDK sees them, so their answers
	// cannot come first.
	r.l.feed(p[:n], r.d.sawIn)
	if err == io.EOF {
		r.l.flush(r.d.sawIn)
		if n > 0 {
			return n, nil // the end again at the next read
		}
		r.d.wait(r.ctx)
	}
	return n, err
}

func (r *drainReader) Close() error {
	r.d.close()
	if c, ok := r.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

type drainWriter struct {
	d *drain
	w io.Writer
	l lines
}

func (w *drainWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil {
		w.d.close() // no answer will get through
		return n, err
	}
	w.l.feed(p, w.d.sawOut)
	return n, nil
}

// Close leaves out open, as the SDK's stdio transport does.
func (w *drainWriter) Close() error {
	w.d.close()
	return nil
}
