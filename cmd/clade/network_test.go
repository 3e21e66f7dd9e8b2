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
	t.Parallel() // a daemon of its own: see TestMain
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
	// Changes keep the rules they do not name; a bare address removes its /32.
	if n := show("--add-allow", "Good.Test", "--remove-allow", "example.com", "--remove-deny", "203.0.113.7", "--add-deny", "198.51.100.0/24"); n.Egress != "deny" ||
		strings.Join(n.Allow, ",") != "10.9.0.0/16,good.test" || strings.Join(n.Deny, ",") != "198.51.100.0/24" {
		t.Fatalf("after --add-allow/--remove-allow: %+v", n)
	}
	if _, errs, code := cli(t, d, "", "network", id, "--allow", "a.test", "--add-allow", "b.test"); code == 0 || !strings.Contains(errs, "give one kind") {
		t.Fatalf("--allow with --add-allow: %q %d", errs, code)
	}
	if _, errs, code := cli(t, d, "", "network", id, "--add-allow", "not a host"); code == 0 || !strings.Contains(errs, "bad allow rule") {
		t.Fatalf("bad added rule: %q %d", errs, code)
	}
	// The last allow rule gone, the policy stays closed.
	if n := show("--remove-allow", "10.9.0.0/16", "--remove-allow", "good.test"); n.Egress != "deny" || len(n.Allow) != 0 || strings.Join(n.Deny, ",") != "198.51.100.0/24" {
		t.Fatalf("after removing every allow rule: %+v", n)
	}
	if n := show("--egress", "deny"); n.Egress != "deny" || len(n.Allow) != 0 || len(n.Deny) != 0 || n.Address == "" {
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
