package sandbox

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestBuildCallOutlastsSleep (runsc): a build's call on its sandbox whose
// agent connection a sleep retires between the call's lookup and its
// call (the memory pressure sleeper, a drain, a sleep asked for) is
// refused unstarted (guest.ErrRetired) and run again on the woken
// sandbox, not failed: the build goes on.
func TestBuildCallOutlastsSleep(t *testing.T) {
	m := newRealManager(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	rec, err := m.Builds().CreateSandbox(ctx, CreateRequest{Image: "default", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	lookups := 0
	buildCallHook = func(id string) {
		lookups++
		if id != rec.ID || lookups > 1 {
			return
		}
		if _, err := m.Sleep(ctx, id); err != nil {
			t.Errorf("sleep between the lookup and the call: %v", err)
		}
	}
	t.Cleanup(func() { buildCallHook = nil })
	var refused int
	p, err := onBuildGuest(ctx, m, rec.ID, func(g *guest.Conn) (*guest.Process, error) {
		p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "echo built"}})
		if guest.IsRetired(err) {
			refused++
		}
		return p, err
	})
	buildCallHook = nil
	if err != nil {
		t.Fatalf("a build's exec after a sleep took its sandbox: %v", err)
	}
	defer p.Close()
	out, _ := io.ReadAll(p.Stdout)
	exit, err := p.Wait(ctx)
	if err != nil || exit.Code != 0 || strings.TrimSpace(string(out)) != "built" {
		t.Fatalf("the exec: exit %+v %v, out %q", exit, err, out)
	}
	if refused != 1 || lookups != 2 {
		t.Fatalf("%d calls refused by the retired connection and %d lookups, want 1 and 2 (the sleep did not come between)", refused, lookups)
	}
	got, err := m.store.GetSandbox(ctx, rec.ID)
	if err != nil || got.State != store.StateRunning {
		t.Fatalf("after the retried call the sandbox is %+v %v, want running (woken)", got.State, err)
	}
}
