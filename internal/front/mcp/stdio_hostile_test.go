package mcp_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	cmcp "github.com/clade-sandbox/clade/internal/front/mcp"
)

// gatedInput gives its chunks in turn; before chunk gate (or the end, if
// gate is len(chunks)) it waits until out holds want, so an answer goes
// out before the drain sees the end of the line it answers.
type gatedInput struct {
	chunks []string
	gate   int
	out    *lockedBuffer
	want   string
	next   int
}

func (g *gatedInput) Read(p []byte) (int, error) {
	if g.next == g.gate {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(g.out.String(), g.want); {
			if time.Now().After(deadline) {
				break // the test reports the missing answer
			}
			time.Sleep(time.Millisecond)
		}
	}
	if g.next == len(g.chunks) {
		return 0, io.EOF
	}
	n := copy(p, g.chunks[g.next])
	g.chunks[g.next] = g.chunks[g.next][n:]
	if g.chunks[g.next] == "" {
		g.next++
	}
	return n, nil
}

// TestStdioEndsForEveryID: the drain waits for no answer the SDK will
// never send. Each client here sends a request the SDK answers (or
// refuses) under an id other than the one encoding/json reads, or answers
// before the drain has seen the newline ending it; clade mcp then waited
// at the end of stdin forever.
func TestStdioEndsForEveryID(t *testing.T) {
	const initLine = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n" + `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n"
	cases := []struct {
		name   string
		chunks []string
		gate   int
		want   string // an answer that must be out before the end
	}{
		{"no newline at the end", []string{initLine, `{"jsonrpc":"2.0","id":30,"method":"ping"}`}, 2, `"id":30`},
		{"newline sent after the answer", []string{initLine, `{"jsonrpc":"2.0","id":31,"method":"ping"}`, "\n"}, 2, `"id":31`},
		{"fractional id", []string{initLine + `{"jsonrpc":"2.0","id":32.5,"method":"ping"}` + "\n"}, 1, `"id":32,`},
		{"id past int64", []string{initLine + `{"jsonrpc":"2.0","id":123456789012345678901234,"method":"ping"}` + "\n"}, 1, `"result"`},
		{"ID in capitals", []string{initLine + `{"jsonrpc":"2.0","ID":33,"method":"ping"}` + "\n"}, 1, `"id":1,`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "t", Version: "1"}, nil)
			out := &lockedBuffer{}
			in := &gatedInput{chunks: c.chunks, gate: c.gate, out: out, want: c.want}
			done := make(chan error, 1)
			go func() {
				done <- srv.Run(context.Background(), cmcp.StdioTransport(context.Background(), in, out))
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("Run still waiting at the end of stdin; out:\n%s", out)
			}
			if !strings.Contains(out.String(), c.want) {
				t.Errorf("out lacks %s:\n%s", c.want, out)
			}
		})
	}
}
