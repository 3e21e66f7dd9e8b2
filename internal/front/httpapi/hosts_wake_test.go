package httpapi_test

import (
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestHostsEditsSurviveSleepAndFork: a line a user appends to the
// sandbox's /etc/hosts is still there after a sleep and wake (the wake
// sends the hostname again) and in a fork child, which has its own name.
func TestHostsEditsSurviveSleepAndFork(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "hosty"})
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo '10.0.0.5 db' >> /etc/hosts"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("append: %+v", r)
	}
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"cat", "/etc/hosts"}})
	if !strings.Contains(r.stdout, "10.0.0.5 db\n") || !strings.Contains(r.stdout, "\thosty\n") {
		t.Fatalf("/etc/hosts after a wake: %q", r.stdout)
	}
	res, err := c.Fork(t.Context(), sb.ID, 1)
	if err != nil || len(res.Children) != 1 || res.Children[0].ID == "" {
		t.Fatalf("fork: %+v %v", res, err)
	}
	kid := res.Children[0].ID
	r = run(t, c, kid, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /etc/hosts; hostname"}})
	if !strings.Contains(r.stdout, "10.0.0.5 db\n") || strings.Contains(r.stdout, "\thosty\n") || !strings.Contains(r.stdout, "\tsb-"+kid[:8]+"\n") {
		t.Fatalf("/etc/hosts in the fork child %s: %q", kid, r.stdout)
	}
	_ = c.DeleteSandbox(t.Context(), kid)
}
