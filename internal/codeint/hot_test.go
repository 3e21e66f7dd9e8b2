package codeint_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// waitHot waits (bounded) until the daemon's hot pool holds n sandboxes.
func waitHot(t *testing.T, d *testenv.Daemon, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		h, err := d.Client.Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if h.Hot == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hot pool holds %d, want %d; daemon log:\n%s", h.Hot, n, d.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling the pool's background refill
	}
}

// execOut runs a shell command in sandbox id and returns its stdout.
func execOut(t *testing.T, c *sdk.Client, id, script string) (string, int) {
	t.Helper()
	var out strings.Builder
	st, err := c.Exec(context.Background(), id, sdk.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), st.Code
}

// startChecks are the exec.started events of sandbox id that ran the
// interpreter's start script (codeint.Proxy.Ensure or the warm step).
func startChecks(t *testing.T, c *sdk.Client, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := c.Events(ctx, sdk.EventFilter{Sandbox: id, Kept: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for e, err := range evs {
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == "exec.started" && e.Exec != nil && strings.Contains(strings.Join(e.Exec.Cmd, " "), codeint.ServerPath) {
			n++
		}
	}
	return n
}

// TestHotPoolWarmsTheInterpreter: a hot-pool sandbox of the
// code-interpreter image runs the server and its Python kernel before it
// is claimed, and the first run after the create goes straight to it (no
// start check); the pool refills warmed.
func TestHotPoolWarmsTheInterpreter(t *testing.T) {
	testenv.BuiltinImage(t, codeint.Image)
	d := testenv.StartDaemon(t, "--hot-pool", "default=0,"+codeint.Image+"=1")
	c := d.Client
	waitHot(t, d, 1, 3*time.Minute)

	sb, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image})
	if err != nil {
		t.Fatal(err)
	}
	// Before any run: the server listens and its default Python kernel
	// is a process of the sandbox.
	out, code := execOut(t, c, sb.ID, `kill -0 "$(cat /run/clade-codeint/server.pid)" && awk '$2 ~ /:C34F$/ && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 && pgrep -f ipykernel_launcher >/dev/null && echo warm`)
	if code != 0 || strings.TrimSpace(out) != "warm" {
		t.Fatalf("claimed sandbox not warmed: exit %d %q; daemon log:\n%s", code, out, d.Log())
	}
	pid, _ := execOut(t, c, sb.ID, "cat /run/clade-codeint/server.pid")
	t0 := time.Now()
	ex := run(t, c, sb.ID, sdk.RunCodeRequest{Code: "1+1"})
	first := time.Since(t0)
	if ex.Text() != "2" {
		t.Fatalf("1+1 = %q %+v", ex.Text(), ex.Error)
	}
	if n := startChecks(t, c, sb.ID); n != 0 {
		t.Fatalf("the proxy ran the start script %d times in a warmed sandbox", n)
	}
	if again, _ := execOut(t, c, sb.ID, "cat /run/clade-codeint/server.pid"); again != pid {
		t.Fatalf("server restarted: pid %q, then %q", pid, again)
	}
	t.Logf("first run after a hot create: %s", first)
	// The pool refills with a warmed sandbox.
	waitHot(t, d, 1, 3*time.Minute)

	// A cold sandbox (the pool's shape is the plain create's; this asks
	// for more memory) still gets its server started on the first run.
	cold, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image, MemoryMiB: 768})
	if err != nil {
		t.Fatal(err)
	}
	if _, code := execOut(t, c, cold.ID, "test -e /run/clade-codeint/server.pid"); code == 0 {
		t.Fatal("a cold sandbox runs a server before any run")
	}
	if ex := run(t, c, cold.ID, sdk.RunCodeRequest{Code: "2+2"}); ex.Text() != "4" {
		t.Fatalf("cold 2+2 = %q %+v", ex.Text(), ex.Error)
	}
	if n := startChecks(t, c, cold.ID); n != 1 {
		t.Fatalf("cold sandbox: the start script ran %d times, want 1", n)
	}
	if ex := run(t, c, cold.ID, sdk.RunCodeRequest{Code: "3+3"}); ex.Text() != "6" {
		t.Fatalf("cold 3+3 = %q", ex.Text())
	}
	if n := startChecks(t, c, cold.ID); n != 1 {
		t.Fatalf("cold sandbox: the start script ran %d times after two runs, want 1", n)
	}
}

// TestHotPoolWarmFailureNotHandedOut: an image whose warm step fails (a
// code-interpreter image without the server: here the default image's
// root under that name) leaves the hot pool empty, its sandboxes
// destroyed, and a create gets a cold sandbox that says what is wrong.
func TestHotPoolWarmFailureNotHandedOut(t *testing.T) {
	shared := testenv.ImagesDir(t)
	dir := testenv.TempDir(t)
	for _, name := range []string{"default", codeint.Image} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		// Hard links: the same filesystem, no copy of the root.
		if out, err := exec.Command("cp", "-al", filepath.Join(shared, "default", "rootfs"), filepath.Join(dir, name, "rootfs")).CombinedOutput(); err != nil {
			t.Skipf("cannot link the default image's root: %v %s", err, out)
		}
		b, _ := json.Marshal(map[string]any{"name": name, "source": "test: the default image's root", "created_at": time.Now().UTC(), "size_bytes": 1})
		if err := os.WriteFile(filepath.Join(dir, name, "image.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := testenv.StartDaemon(t, "--images-dir", dir, "--hot-pool", "default=0,"+codeint.Image+"=1")
	c := d.Client
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(d.Log(), "warm step of the "+codeint.Image+" image exited 3") {
		if time.Now().After(deadline) {
			t.Fatalf("no failed warm step logged:\n%s", d.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon's log
	}
	if h, err := c.Health(context.Background()); err != nil || h.Hot != 0 {
		t.Fatalf("hot pool holds %d after a failed warm step (%v)", h.Hot, err)
	}
	sb, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.RunCode(context.Background(), sb.ID, sdk.RunCodeRequest{Code: "1"}, nil)
	if err == nil || !strings.Contains(err.Error(), "has no code interpreter") {
		t.Fatalf("run in a sandbox without the server: %v", err)
	}
}
