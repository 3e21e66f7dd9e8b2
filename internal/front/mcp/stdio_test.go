package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	cmcp "github.com/clade-sandbox/clade/internal/front/mcp"
)

// endSignal is an input that says when it reached its end.
type endSignal struct {
	r    io.Reader
	once sync.Once
	end  chan struct{}
}

func (e *endSignal) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(func() { close(e.end) })
	}
	return n, err
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStdioAnswersBeforeTheEnd: requests piped in whole (printf ... |
// clade mcp) get their answers although stdin ends while they run; the
// SDK alone cancelled them at the end of its input and exited unanswered.
// A request the client cancels is not waited for.
func TestStdioAnswersBeforeTheEnd(t *testing.T) {
	release := make(chan struct{})
	cancelled := make(chan struct{}, 2)
	srv := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "t", Version: "1"}, nil)
	mcpsdk.AddTool(srv, &mcpsdk.Tool{Name: "slow"}, func(ctx context.Context, _ *mcpsdk.CallToolRequest, in struct {
		Forever bool `json:"forever,omitempty"`
	}) (*mcpsdk.CallToolResult, any, error) {
		if in.Forever {
			<-ctx.Done() // only a cancellation ends it
			return nil, nil, ctx.Err()
		}
		select {
		case <-release:
			return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: "done"}}}, nil, nil
		case <-ctx.Done():
			cancelled <- struct{}{}
			return nil, nil, ctx.Err()
		}
	})
	in := &endSignal{r: strings.NewReader(strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"f","method":"tools/call","params":{"name":"slow","arguments":{"forever":true}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"f"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, // no newline at the end
	}, "\n")), end: make(chan struct{})}
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- srv.Run(t.Context(), cmcp.StdioTransport(t.Context(), in, &out)) }()
	<-in.end
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	select {
	case <-cancelled:
		t.Fatal("the end of stdin cancelled a running request")
	default:
	}
	answered := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("output line %q: %v", line, err)
		}
		answered[string(m.ID)] = string(m.Result)
	}
	if r := answered["2"]; !strings.Contains(r, `"done"`) {
		t.Errorf("tools/call 2 answered %q, want its result; output:\n%s", r, out.String())
	}
	if r := answered["3"]; !strings.Contains(r, `"slow"`) {
		t.Errorf("tools/list 3 answered %q, want the tool list; output:\n%s", r, out.String())
	}
}
