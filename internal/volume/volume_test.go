package volume_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/internal/volume"
	"github.com/clade-sandbox/clade/sdk"
)

var (
	_ sandbox.Hook         = (*volume.Manager)(nil)
	_ sandbox.CreateHook   = (*volume.Manager)(nil)
	_ sandbox.SnapshotHook = (*volume.Manager)(nil)
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

// sh runs a shell command in sandbox id and fails the test if it cannot
// be run at all.
func sh(t *testing.T, c *sdk.Client, id, cmd string) result {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", cmd}, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	return result{out.String(), errb.String(), st.Code}
}

// mustSh runs cmd and fails unless it exits 0; it returns stdout.
func mustSh(t *testing.T, c *sdk.Client, id, cmd string) string {
	t.Helper()
	r := sh(t, c, id, cmd)
	if r.code != 0 {
		t.Fatalf("%q in %s exited %d: %s%s", cmd, id, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// cli runs the clade binary against d and fails the test if it fails.
func cli(t *testing.T, d *testenv.Daemon, args ...string) string {
	t.Helper()
	out, err := exec.Command(d.Bin, append([]string{"--host", d.Socket}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("clade %v: %v: %s", args, err, out)
	}
	return string(out)
}

func create(t *testing.T, c *sdk.Client, req sdk.CreateSandboxRequest) sdk.Sandbox {
	t.Helper()
	sb, err := c.CreateSandbox(t.Context(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func newVolume(t *testing.T, c *sdk.Client, name string, mib int64) sdk.Volume {
	t.Helper()
	v, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: name, SizeBytes: mib << 20})
	if err != nil {
		t.Fatalf("volume create: %v", err)
	}
	return v
}

// TestVolumeOutlivesSandbox: data written in a sandbox survives its
// removal and shows up in a new sandbox; cp works through a volume path;
// removing a volume in use is a conflict naming its user.
func TestVolumeOutlivesSandbox(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "data", 64)
	a := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "data", Path: "/data"}}})
	if got := mustSh(t, c, a.ID, "ls -A /data; mkdir /data/sub; echo kept-$((6*7)) > /data/f; cat /data/f"); got != "kept-42\n" {
		t.Fatalf("a fresh volume is not empty or not writable: %q", got)
	}
	host := filepath.Join(t.TempDir(), "copied")
	if err := os.WriteFile(host, []byte("via cp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cli(t, d, "cp", host, a.ID+":/data/sub/")
	if err := c.DeleteSandbox(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	b := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "data", Path: "/mnt/vol", ReadOnly: true}}})
	if got := mustSh(t, c, b.ID, "cat /mnt/vol/f /mnt/vol/sub/copied"); got != "kept-42\nvia cp\n" {
		t.Fatalf("a new sandbox reads %q from the volume", got)
	}
	if r := sh(t, c, b.ID, "echo x > /mnt/vol/g"); r.code == 0 || !strings.Contains(r.stderr, "Read-only") {
		t.Fatalf("write to a read-only volume: %+v", r)
	}
	out := filepath.Join(t.TempDir(), "out")
	cli(t, d, "cp", b.ID+":/mnt/vol/f", out)
	if got, _ := os.ReadFile(out); string(got) != "kept-42\n" {
		t.Fatalf("cp out of the volume gave %q", got)
	}
	err := c.DeleteVolume(t.Context(), "data")
	if !sdk.IsConflict(err) || !strings.Contains(err.Error(), b.ID) {
		t.Fatalf("rm of a volume in use: %v, want a conflict naming %s", err, b.ID)
	}
	v, err := c.GetVolume(t.Context(), "data")
	if err != nil || len(v.UsedBy) != 1 || v.UsedBy[0] != b.ID || !v.Mounted {
		t.Fatalf("inspect: %+v %v", v, err)
	}
	if err := c.DeleteSandbox(t.Context(), b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVolume(t.Context(), "data"); err != nil {
		t.Fatalf("rm of an unused volume: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "volumes", "named")); len(ents) != 0 {
		t.Fatalf("volume files left after rm: %v", ents)
	}
}
