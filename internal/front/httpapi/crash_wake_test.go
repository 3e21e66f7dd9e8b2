package httpapi_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestWakeAfterKillAtEngineID: a daemon killed once a wake has given the
// sleeping sandbox a prepared engine sandbox from the warm pool (its
// record names it) but before the wake began leaves that prepared
// sandbox behind; the restarted daemon must still wake the sandbox, with
// its files, and leave nothing behind.
func TestWakeAfterKillAtEngineID(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t, "--warm-pool", "1")
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f"}})
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	d.Start([]string{"CLADE_CRASH_AT=wake-after-engine-id"})
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Warm >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool did not fill: %+v %v", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pool's background refill
	}
	if _, err := c.Wake(t.Context(), sb.ID); err == nil {
		t.Fatal("the wake succeeded; the daemon should have crashed in it")
	}
	_ = d.Wait()
	d.Start(nil)
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatalf("wake after the restart: %v\n%s", err, d.Log())
	}
	var out bytes.Buffer
	st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/f"}, Stdout: &out})
	if err != nil || st.Code != 0 || strings.TrimSpace(out.String()) != "kept" {
		t.Fatalf("after the wake: %+v %v %q", st, err, out.String())
	}
}
