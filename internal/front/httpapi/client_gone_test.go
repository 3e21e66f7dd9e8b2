package httpapi_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestClientGoneRemovesWhatItMade: a create or fork whose client goes away
// (Ctrl-C) before the answer runs to its end, then removes what it made:
// the client never learned the ids, so nothing else would.
func TestClientGoneRemovesWhatItMade(t *testing.T) {
	t.Parallel()                // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t) // no pools: a create boots, a fork restores
	c := d.Client

	// The cancel must land while the daemon works on the call: wait until
	// its sandbox is recorded, then cancel. An attempt the daemon answered
	// first is the client's to remove; try again.
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("no create was cancelled while the daemon worked on it in 10 tries")
		}
		label := map[string]string{"try": strconv.Itoa(try)}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 128, Labels: label})
			if err == nil {
				_ = c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
			}
			done <- err
		}()
		var id string
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool {
			for _, sb := range sbs {
				if sb.Labels["try"] == label["try"] {
					id = sb.ID
					return true
				}
			}
			return len(sbs) == 0 && len(done) > 0 // it answered before the list saw it
		})
		cancel()
		if err := <-done; err == nil || id == "" {
			continue
		}
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool { return len(sbs) == 0 })
		if ps := testenv.ProcessesMentioning(id); len(ps) != 0 {
			t.Fatalf("the cancelled create's sandbox %s left processes: %v", id, ps)
		}
		break
	}

	parent := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "parent", MemoryMiB: 128})
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("no fork was cancelled while the daemon worked on it in 10 tries")
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			res, err := c.Fork(ctx, parent.ID, 3)
			for _, ch := range res.Children {
				if ch.ID != "" {
					_ = c.DeleteSandbox(context.WithoutCancel(ctx), ch.ID)
				}
			}
			done <- err
		}()
		var kids []string
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool {
			kids = kids[:0]
			for _, sb := range sbs {
				if sb.ID != parent.ID {
					kids = append(kids, sb.ID)
				}
			}
			return len(kids) > 0 || len(done) > 0
		})
		cancel()
		if err := <-done; err == nil || len(kids) == 0 {
			continue
		}
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool { return len(sbs) == 1 && sbs[0].ID == parent.ID })
		for _, id := range kids {
			if ps := testenv.ProcessesMentioning(id); len(ps) != 0 {
				t.Fatalf("the cancelled fork's child %s left processes: %v", id, ps)
			}
		}
		// The implicit snapshot of `fork ID` goes with its last child.
		snaps, err := c.ListSnapshots(t.Context())
		if err != nil || len(snaps) != 0 {
			t.Fatalf("snapshots after the cancelled fork: %+v %v", snaps, err)
		}
		break
	}
}
