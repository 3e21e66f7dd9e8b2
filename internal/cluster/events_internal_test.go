package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestMergedSlowClient: a merged stream holds at most mergedBuffer events
// for its client; one that leaves them unread for the slow period is cut
// off, saying how to resume, and its parts' sends stop (nothing more is
// held for it).
func TestMergedSlowClient(t *testing.T) {
	a := &Across{slow: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(t.Context())
	m := &merged{a: a, ctx: ctx, cancel: cancel, c: make(chan api.Event, mergedBuffer), done: make(chan struct{})}
	for i := range mergedBuffer {
		if !m.send(api.Event{Node: "n1", Seq: uint64(i + 1)}) {
			t.Fatalf("send %d refused with room in the buffer", i+1)
		}
	}
	start := time.Now()
	if m.send(api.Event{Node: "n1", Seq: mergedBuffer + 1}) {
		t.Fatal("a send past the buffer was taken")
	}
	if took := time.Since(start); took < a.slow {
		t.Fatalf("cut off after %s, before the slow period %s", took, a.slow)
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("the stream was not ended")
	}
	if err := m.Err(); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "since=NODE:SEQ") {
		t.Fatalf("cut off with %v", err)
	}
	if len(m.C()) != mergedBuffer {
		t.Fatalf("%d events held, want the %d before the cut", len(m.C()), mergedBuffer)
	}
	if m.send(api.Event{Node: "n2", Seq: 1}) {
		t.Fatal("a send after the cut was taken")
	}
}
