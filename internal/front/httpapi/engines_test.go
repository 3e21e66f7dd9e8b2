package httpapi_test

import (
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestMissingEngineRefused: on a daemon whose host lacks QEMU, `create
// --engine qemu` is refused with what is missing and how to install it,
// never run in gVisor under a qemu record; /v1/health and `clade info`
// say which engines are there.
func TestMissingEngineRefused(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t, "--qemu", "/nonexistent/qemu-system-x86_64")
	ctx := t.Context()
	h, err := d.Client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gv, vm *sdk.EngineStatus
	for i := range h.Engines {
		switch h.Engines[i].Name {
		case "gvisor":
			gv = &h.Engines[i]
		case "qemu":
			vm = &h.Engines[i]
		}
	}
	if gv == nil || !gv.Available || !gv.Default || vm == nil || vm.Available || !strings.Contains(vm.Reason, "make deps-qemu") {
		t.Fatalf("health engines: %+v; want gvisor available (default), qemu not available naming make deps-qemu", h.Engines)
	}
	_, err = d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Engine: "qemu"})
	if !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "qemu engine is not available") || !strings.Contains(err.Error(), "make deps-qemu") {
		t.Fatalf("create --engine qemu without QEMU: %v; want a 400 naming the missing part and `make deps-qemu`", err)
	}
	if sbs, err := d.Client.ListSandboxes(ctx); err != nil || len(sbs) != 0 {
		t.Fatalf("sandboxes after the refused create: %+v, %v", sbs, err)
	}
	out, errOut, code := cliRun(t, d, "create", "--engine", "qemu")
	if code != 1 || out != "" || !strings.Contains(errOut, "make deps-qemu") {
		t.Fatalf("clade create --engine qemu: code %d, out %q, err %q", code, out, errOut)
	}
	out, errOut, code = cliRun(t, d, "info")
	if code != 0 || !strings.Contains(out, "gvisor") || !strings.Contains(out, "qemu") || !strings.Contains(out, "not available") {
		t.Fatalf("clade info: code %d\n%s%s", code, out, errOut)
	}
}
