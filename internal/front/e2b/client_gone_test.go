package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestClientGoneCreate: an E2B create whose client goes away (an SDK's
// request timeout, a killed process) while the daemon starts the sandbox
// removes it, as the native API does: the client never learned its id,
// and it would run (holding its memory) until its timeout.
func TestClientGoneCreate(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t)
	c := d.Client
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("no create was cancelled while the daemon worked on it in 10 tries")
		}
		ctx, cancel := context.WithCancel(t.Context())
		b, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 3600})
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/sandboxes", bytes.NewReader(b))
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("Content-Type", "application/json")
		done := make(chan error, 1)
		go func() {
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				var sb created
				_ = json.NewDecoder(res.Body).Decode(&sb)
				res.Body.Close()
				if sb.SandboxID != "" {
					_ = c.DeleteSandbox(context.WithoutCancel(ctx), sb.SandboxID)
				}
			}
			done <- err
		}()
		var id string
		deadline := time.Now().Add(30 * time.Second)
		for id == "" && len(done) == 0 && time.Now().Before(deadline) {
			sbs, err := c.ListSandboxes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(sbs) > 0 {
				id = sbs[0].ID
			} else {
				time.Sleep(2 * time.Millisecond) // the poll's pace
			}
		}
		cancel()
		if err := <-done; err == nil || id == "" {
			waitNone(t, d)
			continue
		}
		waitNone(t, d)
		if ps := testenv.ProcessesMentioning(id); len(ps) != 0 {
			t.Fatalf("the cancelled create's sandbox %s left processes: %v", id, ps)
		}
		return
	}
}

// waitNone waits until the daemon lists no sandbox.
func waitNone(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sbs, err := d.Client.ListSandboxes(t.Context())
		if err == nil && len(sbs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes left: %+v (%v)", sbs, err)
		}
		time.Sleep(10 * time.Millisecond) // the poll's pace
	}
}
