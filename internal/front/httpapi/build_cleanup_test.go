package httpapi_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// startCLIBuild runs `clade image build` with a long step in its own
// process and waits until its build sandbox exists; it returns the process
// and the sandbox.
func startCLIBuild(t *testing.T, d *testenv.Daemon, name string) (*exec.Cmd, sdk.Sandbox) {
	t.Helper()
	cmd := exec.Command(d.Bin, "image", "build", name, "--from", "default", "--run", "sleep 300")
	cmd.Env = append(os.Environ(), "CLADE_HOST="+d.Socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	sbs := waitSandboxes(t, d.Client, func(sbs []sdk.Sandbox) bool { return len(sbs) == 1 })
	// The step runs once the build sandbox exists; a kill before it is the
	// same case for the daemon.
	return cmd, sbs[0]
}

// waitSandboxes polls the sandbox list until ok holds (the daemon removes
// a build's sandbox on its own time), for at most 30 s.
func waitSandboxes(t *testing.T, c *sdk.Client, ok func([]sdk.Sandbox) bool) []sdk.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		sbs, err := c.ListSandboxes(ctx)
		if err == nil && ok(sbs) {
			return sbs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandboxes %+v (%v): condition not met within 30s", sbs, err)
		case <-time.After(50 * time.Millisecond): // polling the daemon's list
		}
	}
}

// TestBuildKilledClient: `timeout -s KILL 2 clade image build X --from
// default --run 'sleep 5'` must not leave the build's sandbox running.
func TestBuildKilledClient(t *testing.T) {
	d := testenv.StartDaemon(t)
	cmd, sb := startCLIBuild(t, d, "killed")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitSandboxes(t, d.Client, func(sbs []sdk.Sandbox) bool { return len(sbs) == 0 })
	if ps := testenv.ProcessesMentioning(sb.ID); len(ps) != 0 {
		t.Fatalf("the build sandbox's processes outlived it: %v", ps)
	}
	if _, err := d.Client.GetImage(t.Context(), "killed"); !sdk.IsNotFound(err) {
		t.Fatalf("a killed build left an image: %v", err)
	}
	// An SDK build whose context ends is the same.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := d.Client.Build(ctx, sdk.BuildRequest{Name: "cancelled", From: "default", Run: []string{"sleep 300"}})
		done <- err
	}()
	waitSandboxes(t, d.Client, func(sbs []sdk.Sandbox) bool { return len(sbs) == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled build succeeded")
	}
	waitSandboxes(t, d.Client, func(sbs []sdk.Sandbox) bool { return len(sbs) == 0 })
}

// TestBuildDaemonKilled: a daemon SIGKILLed mid-build removes the build's
// sandbox when it starts again, before it serves; other sandboxes stay.
func TestBuildDaemonKilled(t *testing.T) {
	d := testenv.StartDaemon(t)
	keep := newSandbox(t, d.Client, sdk.CreateSandboxRequest{Name: "keep"})
	cmd, sb := func() (*exec.Cmd, sdk.Sandbox) {
		cmd := exec.Command(d.Bin, "image", "build", "crashed", "--from", "default", "--run", "sleep 300")
		cmd.Env = append(os.Environ(), "CLADE_HOST="+d.Socket)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		sbs := waitSandboxes(t, d.Client, func(sbs []sdk.Sandbox) bool { return len(sbs) == 2 })
		for _, s := range sbs {
			if s.ID != keep.ID {
				return cmd, s
			}
		}
		panic("unreachable")
	}()
	d.Kill()
	if err := cmd.Wait(); err == nil {
		t.Error("the build succeeded without its daemon")
	}
	d.Start(nil)
	sbs, err := d.Client.ListSandboxes(t.Context())
	if err != nil || len(sbs) != 1 || sbs[0].ID != keep.ID || sbs[0].State != "running" {
		t.Fatalf("after the restart: %+v %v; want only %s, running", sbs, err, keep.ID)
	}
	if ps := testenv.ProcessesMentioning(sb.ID); len(ps) != 0 {
		t.Fatalf("the build sandbox's processes outlived the restart: %v", ps)
	}
	if r := run(t, d.Client, keep.ID, sdk.ExecRequest{Cmd: []string{"true"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("the other sandbox after the restart: %+v", r)
	}
}
