//go:build qemu

package qemu_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestDaemonServesBothEngines: one daemon runs a gVisor sandbox and a
// qemu one side by side (clade create --engine qemu); the qemu one
// execs, forks and is removed without leaving a VM behind.
func TestDaemonServesBothEngines(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	h, err := c.Health(ctx)
	if err != nil || !strings.Contains(h.EngineVersion, "qemu") {
		t.Fatalf("health: %+v, %v; want the qemu engine listed", h, err)
	}
	t.Logf("engines: %s", h.EngineVersion)
	if strings.Contains(h.EngineVersion, "tcg (") || strings.Contains(h.EngineVersion, "kvm (") {
		t.Fatalf("health named an accelerator before any VM started (the daemon probed KVM at start): %s", h.EngineVersion)
	}
	run := func(id string, cmd ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: cmd, Stdout: &out, Stderr: &errb})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec %v in %s: %+v %v %s", cmd, id, st, err, errb.String())
		}
		return out.String()
	}
	g, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256, Engine: "qemu", Name: "vm", Network: &sdk.Network{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if vm.Engine != "qemu" || g.Engine != "" {
		t.Fatalf("engines recorded: gvisor sandbox %q, qemu sandbox %q", g.Engine, vm.Engine)
	}
	// A VM has a kernel of its own; gVisor's is its own emulation.
	if k := run(vm.ID, "uname", "-r"); !strings.Contains(k, "cloud-amd64") {
		t.Fatalf("uname in the VM: %q", k)
	}
	// The accelerator is picked at the first VM start, and health says
	// which from then on.
	if h, err := c.Health(ctx); err != nil || !(strings.Contains(h.EngineVersion, "tcg (") || strings.Contains(h.EngineVersion, "kvm (")) {
		t.Fatalf("health after a VM start: %+v, %v; want the accelerator named", h, err)
	}
	if k := run(g.ID, "uname", "-r"); strings.Contains(k, "cloud-amd64") {
		t.Fatalf("uname in the gVisor sandbox: %q", k)
	}
	run(vm.ID, "sh", "-c", "echo parent > /root/f")
	res, err := c.Fork(ctx, vm.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range res.Children {
		if ch.Error != "" {
			t.Fatalf("fork child: %+v", ch)
		}
		if out := run(ch.ID, "cat", "/root/f"); out != "parent\n" {
			t.Fatalf("child %s: %q", ch.ID, out)
		}
		// The engine sets a child's hostname as it restores it (the
		// daemon skips its own round trip for it).
		if out, want := run(ch.ID, "hostname"), "sb-"+ch.ID[:8]+"\n"; out != want {
			t.Fatalf("child %s hostname %q, want %q", ch.ID, out, want)
		}
		if sb, err := c.GetSandbox(ctx, ch.ID); err != nil || sb.Engine != "qemu" {
			t.Fatalf("child %s: %+v %v; want engine qemu", ch.ID, sb, err)
		}
	}
	// Sleep and wake keep it a VM with its files.
	if _, err := c.Sleep(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	if out := run(vm.ID, "sh", "-c", "cat /root/f; uname -r"); !strings.HasPrefix(out, "parent\n") || !strings.Contains(out, "cloud-amd64") {
		t.Fatalf("after wake: %q", out)
	}
	if _, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Engine: "firecracker"}); err == nil || !strings.Contains(err.Error(), "gvisor, qemu") {
		t.Fatalf("create with an unknown engine: %v; want an error naming the engines", err)
	}
	all, _ := c.ListSandboxes(ctx)
	for _, sb := range all {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if left := testenv.ProcessesMentioning(d.DataDir + "/qemu/"); len(left) > 0 {
		t.Fatalf("qemu processes left after rm: %v", left)
	}
}

// TestDaemonDefaultEngineChanged: sandboxes made while gVisor was the
// default (their records name no engine) survive a restart of the daemon
// with --engine qemu: the running one is attached, the sleeping one wakes
// and a snapshot forks, all still in gVisor; new sandboxes are VMs.
func TestDaemonDefaultEngineChanged(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	run, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "running"})
	if err != nil {
		t.Fatal(err)
	}
	nap, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "asleep"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{run.ID, nap.ID} {
		if st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f"}}); err != nil || st.Code != 0 {
			t.Fatalf("exec in %s: %+v %v", id, st, err)
		}
	}
	snap, err := c.SnapshotSandbox(ctx, run.ID, "before-restart")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sleep(ctx, nap.ID); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	d.SetArgs("--engine", "qemu")
	d.Start(nil)

	read := func(id string) string {
		t.Helper()
		var out, errb bytes.Buffer
		st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; uname -r"}, Stdout: &out, Stderr: &errb})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec in %s after the restart: %+v %v %s", id, st, err, errb.String())
		}
		return out.String()
	}
	isGVisor := func(id, out string) {
		t.Helper()
		if !strings.HasPrefix(out, "kept\n") || strings.Contains(out, "cloud-amd64") {
			t.Fatalf("%s after the restart with --engine qemu: %q, want its file, in gVisor", id, out)
		}
	}
	if sb, err := c.GetSandbox(ctx, run.ID); err != nil || sb.State != "running" {
		t.Fatalf("the running sandbox after the restart: %+v %v", sb, err)
	}
	isGVisor(run.ID, read(run.ID))
	if _, err := c.Wake(ctx, nap.ID); err != nil {
		t.Fatalf("wake of a gVisor sandbox under a qemu default: %v", err)
	}
	isGVisor(nap.ID, read(nap.ID))
	res, err := c.Fork(ctx, snap.ID, 1)
	if err != nil || len(res.Children) != 1 || res.Children[0].Error != "" {
		t.Fatalf("fork of a gVisor snapshot under a qemu default: %+v %v", res, err)
	}
	isGVisor(res.Children[0].ID, read(res.Children[0].ID))
	vm, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256, Network: &sdk.Network{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if st, err := c.Exec(ctx, vm.ID, sdk.ExecRequest{Cmd: []string{"uname", "-r"}, Stdout: &out}); err != nil || st.Code != 0 || !strings.Contains(out.String(), "cloud-amd64") {
		t.Fatalf("a new sandbox under --engine qemu: %+v %v %q, want a VM", st, err, out.String())
	}
}

// TestEngineGoneRefuses: a qemu sandbox asleep and a qemu snapshot, on a
// daemon restarted where QEMU is missing: wake, fork and create are
// refused with what is missing (never restored by gVisor), the sandbox
// stays asleep, and with QEMU back it wakes with its files.
func TestEngineGoneRefuses(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	vm, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256, Engine: "qemu", Network: &sdk.Network{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, vm.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f"}}); err != nil {
		t.Fatal(err)
	}
	snap, err := c.SnapshotSandbox(ctx, vm.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sleep(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	d.SetArgs("--qemu", "/nonexistent/qemu-system-x86_64")
	d.Start(nil)
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "qemu engine is not available") || !strings.Contains(err.Error(), "make deps-qemu") {
			t.Fatalf("%s without QEMU: %v; want a refusal naming the missing part and `make deps-qemu`", what, err)
		}
	}
	_, err = c.Wake(ctx, vm.ID)
	refused("wake", err)
	if sb, err := c.GetSandbox(ctx, vm.ID); err != nil || sb.State != "sleeping" {
		t.Fatalf("after the refused wake: %+v, %v; want it still sleeping", sb, err)
	}
	if res, ferr := c.Fork(ctx, snap.ID, 1); ferr == nil {
		for _, ch := range res.Children {
			refused("fork child", errorString(ch.Error))
		}
	} else {
		refused("fork", ferr)
	}
	_, err = c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Engine: "qemu"})
	refused("create", err)
	d.Stop()
	d.SetArgs("--qemu", "")
	d.Start(nil)
	var out bytes.Buffer
	if st, err := c.Exec(ctx, vm.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; uname -r"}, Stdout: &out}); err != nil || st.Code != 0 ||
		!strings.HasPrefix(out.String(), "kept\n") || !strings.Contains(out.String(), "cloud-amd64") {
		t.Fatalf("with QEMU back, exec (wakes it): %+v %v %q", st, err, out.String())
	}
}

// errorString is s as an error, nil when empty.
func errorString(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}
