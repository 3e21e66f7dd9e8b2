package httpapi_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestClientGoneCreateFromSnapshot: a create from a snapshot whose client
// goes away while the daemon restores it removes the sandbox it made, as
// a plain create does (the restore runs on; what follows it must not fail
// for the cancel and skip the removal).
func TestClientGoneCreateFromSnapshot(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	parent := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "parent", MemoryMiB: 128})
	sn, err := c.SnapshotSandbox(t.Context(), parent.ID, "snap")
	if err != nil {
		t.Fatal(err)
	}
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("no create from the snapshot was cancelled while the daemon worked on it in 10 tries")
		}
		name := "kid-" + strconv.Itoa(try)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: name, FromSnapshot: sn.ID})
			if err == nil {
				_ = c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
			}
			done <- err
		}()
		var id string
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool {
			for _, sb := range sbs {
				if sb.Name == name {
					id = sb.ID
					return true
				}
			}
			return len(done) > 0
		})
		cancel()
		if err := <-done; err == nil || id == "" {
			continue
		}
		waitSandboxes(t, c, func(sbs []sdk.Sandbox) bool { return len(sbs) == 1 && sbs[0].ID == parent.ID })
		if ps := testenv.ProcessesMentioning(id); len(ps) != 0 {
			t.Fatalf("the cancelled create's sandbox %s left processes: %v", id, ps)
		}
		break
	}
}
