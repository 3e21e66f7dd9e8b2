//go:build qemu

package qemu_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

const fetchPy = `
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode(), end="")
except Exception as e:
    print("failed:", type(e).__name__, end="")
`

// TestVMNetwork: a VM with a network reaches a test host by name under its
// sandbox's egress policy (QEMU's user-mode network runs inside the
// sandbox's namespace), is refused what the policy denies, and its fork
// children reach it too.
func TestVMNetwork(t *testing.T) {
	hp := testenv.ReserveNet(t)
	host := testenv.StartTestHost(t, hp)
	d := testenv.StartDaemon(t, "--dns-upstream", host.DNS)
	c := d.Client
	ctx := t.Context()
	fetch := func(id, url string) string {
		t.Helper()
		var out bytes.Buffer
		if _, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"python3", "-c", fetchPy, url}, Stdout: &out}); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	vm, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Engine: "qemu", MemoryMiB: 256, Network: &sdk.Network{Allow: []string{"good.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "hello from " + host.Addr.String()
	if got := fetch(vm.ID, "http://good.test/"); got != want {
		t.Fatalf("VM fetch of an allowed host: %q, want %q", got, want)
	}
	if got := fetch(vm.ID, "http://"+host.Addr2.String()+"/"); !strings.HasPrefix(got, "failed") {
		t.Fatalf("VM fetch of a host its policy denies: %q, want a failure", got)
	}
	res, err := c.Fork(ctx, vm.ID, 1)
	if err != nil || res.Children[0].Error != "" {
		t.Fatalf("fork: %+v %v", res, err)
	}
	if got := fetch(res.Children[0].ID, "http://good.test/"); got != want {
		t.Fatalf("fork child fetch: %q, want %q", got, want)
	}
	all, _ := c.ListSandboxes(ctx)
	for _, sb := range all {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
}
