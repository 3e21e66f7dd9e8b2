package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// xattrAgent serves a fake agent with features whose OpXattrGet answers
// are answer(request), counting the requests it got.
func xattrAgent(t *testing.T, answer func(wire.Request) string, features ...string) (*Conn, <-chan wire.Request) {
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	host, ag := socketPair(t)
	serveAsync(g, host)
	a := newFake(t, ag)
	a.hello(nil, append([]string{wire.FeatureAuth}, features...)...)
	a.expect(wire.Key)
	a.write(wire.Key, 0, nil)
	reqs := make(chan wire.Request, 64)
	go func() {
		for {
			f, err := a.r.Read()
			if err != nil {
				return
			}
			switch f.Type {
			case wire.Ping:
				_ = a.w.Write(wire.Pong, 0, bytes.Clone(f.Payload))
			case wire.Open:
				var req wire.Request
				_ = json.Unmarshal(f.Payload, &req)
				reqs <- req
				exit, _ := json.Marshal(wire.ExitMsg{Info: json.RawMessage(answer(req))})
				_ = a.w.Write(wire.Exit, f.Channel, exit)
			}
		}
	}()
	return g, reqs
}

// TestXattrsHostileAnswers: what the agent answers is checked (one entry
// per path, within the bound), paths go in batches, and an agent without
// attributes is refused before anything is sent to it.
func TestXattrsHostileAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	old, reqs := xattrAgent(t, func(wire.Request) string { return "[]" })
	if _, err := old.Xattrs(ctx, "user.e2b.", []string{"/a"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an agent without attributes: %v", err)
	}
	if err := old.SetXattrs(ctx, "/a", "user.e2b.", map[string]string{"k": "v"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an agent without attributes: %v", err)
	}
	select {
	case r := <-reqs:
		t.Fatalf("a request reached an agent without attributes: %v", r.Op)
	default:
	}

	for name, answer := range map[string]string{
		"too few":   `[]`,
		"too many":  `[null, null]`,
		"not JSON":  `{`,
		"oversized": `[{"k": "` + strings.Repeat("v", wire.MaxXattrBytes) + `"}]`,
	} {
		g, _ := xattrAgent(t, func(wire.Request) string { return answer }, wire.FeatureXattr)
		if _, err := g.Xattrs(ctx, "user.e2b.", []string{"/a"}); errdefs.ClassOf(err) != errdefs.Internal {
			t.Errorf("%s: %v, want an Internal error", name, err)
		}
	}

	paths := make([]string, wire.MaxXattrPaths*2+1)
	for i := range paths {
		paths[i] = "/f" + strings.Repeat("x", i%7)
	}
	g, reqs := xattrAgent(t, func(r wire.Request) string {
		out := make([]map[string]string, len(r.Paths))
		for i, p := range r.Paths {
			out[i] = map[string]string{"path": p}
		}
		b, _ := json.Marshal(out)
		return string(b)
	}, wire.FeatureXattr)
	got, err := g.Xattrs(ctx, "user.e2b.", paths)
	if err != nil || len(got) != len(paths) {
		t.Fatalf("got %d, %v", len(got), err)
	}
	for i, m := range got {
		if m["path"] != paths[i] {
			t.Fatalf("entry %d is %v, for %s", i, m, paths[i])
		}
	}
	for range 3 {
		if r := <-reqs; len(r.Paths) > wire.MaxXattrPaths || r.Op != wire.OpXattrGet {
			t.Fatalf("a request of %d paths, op %s", len(r.Paths), r.Op)
		}
	}
	if _, err := g.Xattrs(ctx, "user.e2b.", nil); err != nil {
		t.Fatalf("no paths: %v", err)
	}
	select {
	case r := <-reqs:
		t.Fatalf("no paths sent a request: %v", r)
	default:
	}
}
