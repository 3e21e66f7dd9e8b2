package main_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestCLINetwork: create with a policy, show it, change it, and mode none.
func TestCLINetwork(t *testing.T) {
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create", "--allow", "example.com", "--allow", "10.9.0.0/16", "--deny", "203.0.113.7")
	if code != 0 {
		t.Fatalf("create: %q %q", out, errs)
	}
	id := strings.TrimSpace(out)
	show := func(args ...string) sdk.Network {
		t.Helper()
		out, errs, code := cli(t, d, "", append([]string{"network", id}, args...)...)
		var n sdk.Network
		if code != 0 || json.Unmarshal([]byte(out), &n) != nil {
			t.Fatalf("network %v: %q %q %d", args, out, errs, code)
		}
		return n
	}
	n := show() // any allow rule makes an allowlist: egress reads deny
	if n.Mode != "internet" || n.Egress != "deny" || n.Address == "" || strings.Join(n.Allow, ",") != "example.com,10.9.0.0/16" || strings.Join(n.Deny, ",") != "203.0.113.7/32" {
		t.Fatalf("network: %+v", n)
	}
	if n := show("--egress", "deny"); n.Egress != "deny" || len(n.Allow) != 0 || n.Address == "" {
		t.Fatalf("after --egress deny: %+v", n)
	}
	if out, _, _ := cli(t, d, "", "inspect", id); !strings.Contains(out, `"address"`) {
		t.Fatalf("inspect shows no address: %s", out)
	}
	if _, errs, code := cli(t, d, "", "network", id, "--allow", "not a host"); code == 0 || !strings.Contains(errs, "bad allow rule") {
		t.Fatalf("bad rule: %q %d", errs, code)
	}
	out, errs, code = cli(t, d, "", "create", "--network", "none")
	if code != 0 {
		t.Fatalf("create none: %q %q", out, errs)
	}
	if out, _, _ := cli(t, d, "", "network", strings.TrimSpace(out)); !strings.Contains(out, `"mode": "none"`) {
		t.Fatalf("network of mode none: %s", out)
	}
}
