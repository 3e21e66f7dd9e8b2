package volume_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/internal/volume"
	"github.com/clade-sandbox/clade/sdk"
	"golang.org/x/sys/unix"
)

var (
	_ sandbox.Hook         = (*volume.Manager)(nil)
	_ sandbox.CreateHook   = (*volume.Manager)(nil)
	_ sandbox.SnapshotHook = (*volume.Manager)(nil)
)

// TestMain: the tests that start daemons (each its own, on its own data
// dir and network share) run in parallel, two at a time (go test's
// -parallel on two cores), their subtests of a daemon each too: much of a
// test is waiting (a daemon killed and restarted, an agent dialling back
// in, a checkpoint written) that another's work fills. The package ran
// every test in turn (669 s under load). Those of host-wide state (free
// disk, $PATH) stay sequential; they run before the parallel ones.
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
	t.Parallel() // a daemon of its own: see TestMain
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

// TestVolumeSizeLimit: writes past a volume's size fail with ENOSPC
// inside the sandbox, and the image on the host stays within the size.
func TestVolumeSizeLimit(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	v := newVolume(t, c, "small", 16)
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "small", Path: "/data"}}})
	r := sh(t, c, sb.ID, "dd if=/dev/zero of=/data/big bs=1M count=64 conv=fsync")
	if r.code == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("writing 64 MiB into a 16 MiB volume: %+v", r)
	}
	v, err := c.GetVolume(t.Context(), v.Name)
	if err != nil {
		t.Fatal(err)
	}
	// Its image is reserved whole at create (plus the host's extent
	// blocks for it, a few KiB): writing it full takes nothing more.
	if v.UsedBytes > v.SizeBytes+64<<10 {
		t.Fatalf("the volume takes %d bytes on the host, more than its size %d", v.UsedBytes, v.SizeBytes)
	}
	// The rest of the sandbox is unaffected: its own files still write.
	mustSh(t, c, sb.ID, "echo ok > /root/f")
}

// TestVolumeSleepWake: a process writing to a volume is slept and woken
// with the volume in place (the same image, nothing copied): every write
// it acknowledged is there, it goes on writing, and it still holds its
// open file.
func TestVolumeSleepWake(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	v := newVolume(t, c, "db", 64)
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "db", Path: "/var/lib/db"}}})
	// A sqlite writer that acknowledges each commit on stdout, and a
	// process that keeps a file on the volume open across the sleep.
	acked := mustSh(t, c, sb.ID, `python3 -c '
import sqlite3
db = sqlite3.connect("/var/lib/db/app.sqlite")
db.execute("create table t (n integer)")
for i in range(500):
    db.execute("insert into t values (?)", (i,))
    db.commit()
print(500)
'
nohup python3 -c '
import time
f = open("/var/lib/db/held", "a")
f.write("before\n"); f.flush()
open("/tmp/holder-ready", "w").close()
while not __import__("os").path.exists("/tmp/woke"):
    time.sleep(0.01)
f.write("after\n"); f.close()
open("/tmp/holder-done", "w").close()
' > /dev/null 2>&1 &
until [ -e /tmp/holder-ready ]; do sleep 0.01; done`)
	if strings.TrimSpace(acked) != "500" {
		t.Fatalf("writer: %q", acked)
	}
	img := filepath.Join(d.DataDir, "volumes", "named", v.ID, "disk.img")
	before, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.GetVolume(t.Context(), "db"); got.Mounted {
		t.Fatalf("a sleeping sandbox's volume is still mounted on the host: %+v", got)
	}
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(img)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the volume's image was replaced by the wake: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "volumes", "sandboxes")); len(ents) != 0 {
		t.Fatalf("the wake copied the volume: %v", ents)
	}
	got := mustSh(t, c, sb.ID, `python3 -c '
import sqlite3
print(sqlite3.connect("/var/lib/db/app.sqlite").execute("select count(*), sum(n) from t").fetchone())
'
touch /tmp/woke; until [ -e /tmp/holder-done ]; do sleep 0.01; done; cat /var/lib/db/held`)
	if got != "(500, 124750)\nbefore\nafter\n" {
		t.Fatalf("after the wake: %q", got)
	}
}

// TestVolumeFork: fork children each get their own copy of the volume as
// it was at the snapshot; siblings and the parent never see each other's
// writes; a shared volume is the same one in every child. The parent's
// processes live through the snapshot.
func TestVolumeFork(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "work", 32)
	newVolume(t, c, "common", 32)
	parent := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "work", Path: "/work"}, {Name: "common", Path: "/common", Shared: true}}})
	mustSh(t, c, parent.ID, "echo snap > /work/f; echo base > /common/c; nohup sleep 100000 > /dev/null 2>&1 & echo $! > /tmp/pid")
	snap, err := c.SnapshotSandbox(t.Context(), parent.ID, "base")
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, c, parent.ID, "kill -0 $(cat /tmp/pid) && echo parent-after > /work/f")
	res, err := c.Fork(t.Context(), snap.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range res.Children {
		if k.Error != "" {
			t.Fatalf("child: %s", k.Error)
		}
		kids = append(kids, k.ID)
	}
	for _, k := range kids {
		if got := mustSh(t, c, k, "cat /work/f /common/c"); got != "snap\nbase\n" {
			t.Fatalf("child %s reads %q, want the volume as it was at the snapshot", k, got)
		}
		mustSh(t, c, k, "echo "+k+" > /work/f; echo "+k+" > /common/from-"+k)
	}
	for _, k := range kids {
		if got := mustSh(t, c, k, "cat /work/f"); got != k+"\n" {
			t.Fatalf("child %s reads %q from its own copy: a sibling's write leaked", k, got)
		}
		if got := mustSh(t, c, k, "cat /common/from-"+kids[0]+" /common/from-"+kids[1]); got != kids[0]+"\n"+kids[1]+"\n" {
			t.Fatalf("child %s does not see its siblings' writes to the shared volume: %q", k, got)
		}
	}
	if got := mustSh(t, c, parent.ID, "cat /work/f; ls /common | wc -l"); got != "parent-after\n3\n" {
		t.Fatalf("parent reads %q", got)
	}
	sb, err := c.GetSandbox(t.Context(), kids[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Volumes) != 2 || (sb.Volumes[0].Clone != "copy" && sb.Volumes[0].Clone != "reflink") || sb.Volumes[1].Clone != "" || !sb.Volumes[1].Shared {
		t.Fatalf("inspect of a child shows volumes %+v: want its own copy of work, common shared", sb.Volumes)
	}
	err = c.DeleteVolume(t.Context(), "work")
	if !sdk.IsConflict(err) || !strings.Contains(err.Error(), parent.ID) || strings.Contains(err.Error(), kids[0]) {
		t.Fatalf("rm of work: %v, want a conflict naming the parent only", err)
	}
	for _, id := range append(kids, parent.ID) {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(t.Context(), snap.ID); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"sandboxes", "snapshots", "mnt"} {
		if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "volumes", sub)); len(ents) != 0 {
			t.Errorf("volumes/%s holds %d entries after every user is gone", sub, len(ents))
		}
	}
}

// TestVolumeDaemonKill: a daemon killed with SIGKILL leaves a running
// sandbox's volume mounted and its data intact; the next daemon keeps
// them, and collects what a killed daemon left half made: a volume still
// being created, files and mounts nobody records.
func TestVolumeDaemonKill(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "keep", 32)
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "keep", Path: "/data"}}})
	mustSh(t, c, sb.ID, "echo durable > /data/f && sync /data/f")
	// One asleep at the kill, with a volume of its own.
	newVolume(t, c, "napping", 16)
	sleeper := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "napping", Path: "/nap"}}})
	mustSh(t, c, sleeper.ID, "echo zzz > /nap/f")
	if _, err := c.Sleep(t.Context(), sleeper.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()

	// What a daemon killed in the middle of a volume create leaves.
	st, err := store.Open(t.Context(), filepath.Join(d.DataDir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	half := store.Volume{ID: strings.Repeat("ab", 16), Name: "half", SizeBytes: 16 << 20, State: store.VolumeCreating}
	if err := st.InsertVolume(t.Context(), half); err != nil {
		t.Fatal(err)
	}
	st.Close()
	vdir := filepath.Join(d.DataDir, "volumes")
	for _, p := range []string{"named/" + half.ID, "named/" + strings.Repeat("cd", 16), "sandboxes/" + strings.Repeat("ef", 8), "mnt/v-stray"} {
		if err := os.MkdirAll(filepath.Join(vdir, p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(vdir, "named", half.ID, "disk.img"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(vdir, "mnt", "v-stray")
	if err := unix.Mount("tmpfs", stray, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(stray, unix.MNT_DETACH) })

	d.Start(nil)
	if got := mustSh(t, c, sb.ID, "cat /data/f; echo more >> /data/f; cat /data/f"); got != "durable\ndurable\nmore\n" {
		t.Fatalf("after the restart the sandbox reads %q", got)
	}
	if _, err := c.GetVolume(t.Context(), "half"); !sdk.IsNotFound(err) {
		t.Fatalf("a half-made volume survived the restart: %v", err)
	}
	for _, p := range []string{"named/" + half.ID, "named/" + strings.Repeat("cd", 16), "sandboxes/" + strings.Repeat("ef", 8), "mnt/v-stray"} {
		if _, err := os.Stat(filepath.Join(vdir, p)); !os.IsNotExist(err) {
			t.Errorf("%s is left after the restart (%v)", p, err)
		}
	}
	if got := mustSh(t, c, sleeper.ID, "cat /nap/f"); got != "zzz\n" { // wakes it
		t.Fatalf("a sandbox asleep across the restart reads %q", got)
	}
	if err := c.DeleteSandbox(t.Context(), sleeper.ID); err != nil {
		t.Fatal(err)
	}
	// The restarted daemon knows the sandbox uses its volume.
	if err := c.DeleteVolume(t.Context(), "keep"); !sdk.IsConflict(err) {
		t.Fatalf("rm of a volume in use after a restart: %v", err)
	}
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(vdir, "mnt")); len(ents) != 0 {
		t.Fatalf("mounts left after the last user went: %v", ents)
	}
	// The data outlived the sandbox and both daemons.
	sb2 := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "keep", Path: "/data"}}})
	if got := mustSh(t, c, sb2.ID, "cat /data/f"); got != "durable\nmore\n" {
		t.Fatalf("a new sandbox reads %q", got)
	}
}

// TestVolumeBadInput: hostile or wrong names, paths and sizes are 4xx
// with a message, and leave nothing behind; a symlink planted in a volume
// resolves inside the sandbox that follows it, never on the host.
func TestVolumeBadInput(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "v", 16)
	vol := func(name, path string) []sdk.VolumeMount { return []sdk.VolumeMount{{Name: name, Path: path}} }
	for _, tc := range []struct {
		name string
		req  sdk.CreateSandboxRequest
		is   func(error) bool
	}{
		{"dotdot", sdk.CreateSandboxRequest{Volumes: vol("v", "/data/../etc")}, sdk.IsInvalidArgument},
		{"relative", sdk.CreateSandboxRequest{Volumes: vol("v", "data")}, sdk.IsInvalidArgument},
		{"root", sdk.CreateSandboxRequest{Volumes: vol("v", "/")}, sdk.IsInvalidArgument},
		{"proc", sdk.CreateSandboxRequest{Volumes: vol("v", "/proc/x")}, sdk.IsInvalidArgument},
		{"agent dir", sdk.CreateSandboxRequest{Volumes: vol("v", "/.clade")}, sdk.IsInvalidArgument},
		{"covers resolv.conf", sdk.CreateSandboxRequest{Volumes: vol("v", "/etc")}, sdk.IsInvalidArgument},
		{"overlap", sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: "/a"}, {Name: "v", Path: "/a/b"}}}, sdk.IsInvalidArgument},
		{"name with slash", sdk.CreateSandboxRequest{Volumes: vol("../v", "/data")}, sdk.IsInvalidArgument},
		{"unknown", sdk.CreateSandboxRequest{Volumes: vol("nope", "/data")}, sdk.IsNotFound},
		{"clone from the client", sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: "/data", Clone: "copy"}}}, sdk.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := c.CreateSandbox(t.Context(), tc.req)
			if err == nil {
				_ = c.DeleteSandbox(t.Context(), sb.ID)
				t.Fatalf("created a sandbox with %+v", tc.req.Volumes)
			}
			if !tc.is(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	for _, tc := range []struct {
		name string
		req  sdk.CreateVolumeRequest
		is   func(error) bool
	}{
		{"dotdot name", sdk.CreateVolumeRequest{Name: ".."}, sdk.IsInvalidArgument},
		{"slash name", sdk.CreateVolumeRequest{Name: "a/b"}, sdk.IsInvalidArgument},
		{"empty name", sdk.CreateVolumeRequest{}, sdk.IsInvalidArgument},
		{"too small", sdk.CreateVolumeRequest{Name: "tiny", SizeBytes: 1 << 20}, sdk.IsInvalidArgument},
		{"negative", sdk.CreateVolumeRequest{Name: "neg", SizeBytes: -1}, sdk.IsInvalidArgument},
		{"taken", sdk.CreateVolumeRequest{Name: "v", SizeBytes: 16 << 20}, sdk.IsConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.CreateVolume(t.Context(), tc.req); !tc.is(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "volumes", "named")); len(ents) != 1 {
		t.Fatalf("refused creates left volume files: %d entries", len(ents))
	}

	a := create(t, c, sdk.CreateSandboxRequest{Name: "planter", Volumes: vol("v", "/data")})
	// Targets that exist inside the follower only, never on the host.
	marker := "/root/clade-volume-symlink-marker"
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("%s exists on the host: the test cannot tell inside from outside", marker)
	}
	mustSh(t, c, a.ID, "ln -s / /data/escape && ln -s ../../../../../../.."+marker+" /data/up")
	if err := c.DeleteSandbox(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	b := create(t, c, sdk.CreateSandboxRequest{Name: "follower", Volumes: vol("v", "/data")})
	if got := mustSh(t, c, b.ID, "echo inside > "+marker+"; cat /data/escape"+marker+" /data/up"); got != "inside\ninside\n" {
		t.Fatalf("symlinks in the volume resolve to %q, want the follower's own file", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	cli(t, d, "cp", b.ID+":/data/up", out)
	// cp copies the link itself or what it points to inside the sandbox.
	if fi, err := os.Lstat(out); err != nil {
		t.Fatal(err)
	} else if fi.Mode()&os.ModeSymlink == 0 {
		if got, _ := os.ReadFile(out); string(got) != "inside\n" {
			t.Fatalf("cp of a symlink in the volume gave %q", got)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a write through the volume's symlinks reached the host: %v", err)
	}
}

// TestVolumeWarmPool: with prepared sandboxes in the pool (made without
// volumes), creates, wakes and forks of sandboxes with volumes still get
// their volumes; a fork straight from a running sandbox copies its volume.
func TestVolumeWarmPool(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t, "--warm-pool", "2")
	c := d.Client
	newVolume(t, c, "pooled", 32)
	create(t, c, sdk.CreateSandboxRequest{}) // the pool fills for this shape
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "pooled", Path: "/data"}}})
	mustSh(t, c, sb.ID, "echo one > /data/f")
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, c, sb.ID, "cat /data/f; echo two >> /data/f"); got != "one\n" {
		t.Fatalf("after a wake: %q", got)
	}
	res, err := c.Fork(t.Context(), sb.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range res.Children {
		if k.Error != "" {
			t.Fatalf("child: %s", k.Error)
		}
		if got := mustSh(t, c, k.ID, "cat /data/f; echo "+k.ID+" > /data/f"); got != "one\ntwo\n" {
			t.Fatalf("child %s reads %q", k.ID, got)
		}
	}
	if got := mustSh(t, c, sb.ID, "cat /data/f"); got != "one\ntwo\n" {
		t.Fatalf("the parent sees its children's writes: %q", got)
	}
}

// TestVolumeTemplate: a template built with a volume records the volume's
// content as its start command left it; each sandbox of the template gets
// its own copy, and the named volume is not touched by them.
func TestVolumeTemplate(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	for _, enc := range []bool{false, true} {
		name := "plain"
		if enc {
			name = "encrypted"
			if _, err := exec.LookPath("gocryptfs"); err != nil {
				t.Logf("skipping %s: gocryptfs is not installed (make deps)", name)
				continue
			}
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a daemon of its own
			testVolumeTemplate(t, enc)
		})
	}
}

func testVolumeTemplate(t *testing.T, encrypt bool) {
	d := testenv.StartDaemon(t)
	c := d.Client
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "seed", SizeBytes: 32 << 20, Encrypt: encrypt}); err != nil {
		t.Fatal(err)
	}
	seeder := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "seed", Path: "/data"}}})
	mustSh(t, c, seeder.ID, "echo seeded > /data/base")
	if err := c.DeleteSandbox(t.Context(), seeder.ID); err != nil {
		t.Fatal(err)
	}
	tmpl, err := c.Build(t.Context(), sdk.BuildRequest{Name: "voltmpl", From: "default",
		Start: "echo started > /data/ready; exec sleep 100000", Ready: "test -e /data/ready",
		Volumes: []sdk.VolumeMount{{Name: "seed", Path: "/data"}}})
	if err != nil {
		t.Fatalf("template build: %v", err)
	}
	if tmpl.Snapshot == "" {
		t.Fatalf("no template snapshot: %+v", tmpl)
	}
	var kids []string
	for range 2 {
		kids = append(kids, create(t, c, sdk.CreateSandboxRequest{Image: "voltmpl"}).ID)
	}
	for _, k := range kids {
		if got := mustSh(t, c, k, "cat /data/base /data/ready; grep -qx sleep /proc/[0-9]*/comm && echo running"); got != "seeded\nstarted\nrunning\n" {
			t.Fatalf("a sandbox of the template reads %q", got)
		}
		mustSh(t, c, k, "echo "+k+" > /data/own")
	}
	for _, k := range kids {
		if got := mustSh(t, c, k, "cat /data/own"); got != k+"\n" {
			t.Fatalf("%s reads a sibling's write: %q", k, got)
		}
	}
	sb, _ := c.GetSandbox(t.Context(), kids[0])
	if len(sb.Volumes) != 1 || sb.Volumes[0].Clone == "" {
		t.Fatalf("a template sandbox's volumes: %+v", sb.Volumes)
	}
	check := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "seed", Path: "/data"}}})
	if got := mustSh(t, c, check.ID, "ls /data"); got != "base\nready\n" {
		t.Fatalf("the named volume holds %q: the template's start wrote there (as it should) and its sandboxes must not", got)
	}
	if err := c.DeleteSandbox(t.Context(), check.ID); err != nil {
		t.Fatal(err)
	}
	// The template's sandboxes hold copies, not the named volume: it can
	// go, and their copies (an encrypted one opens with the key its
	// record carries) still mount at a wake.
	if err := c.DeleteVolume(t.Context(), "seed"); err != nil {
		t.Fatalf("rm of a volume only copies come from: %v", err)
	}
	if _, err := c.Sleep(t.Context(), kids[0]); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, c, kids[0], "cat /data/base /data/own"); got != "seeded\n"+kids[0]+"\n" {
		t.Fatalf("after the named volume went, a woken template sandbox reads %q", got)
	}
	for _, id := range kids {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteImage(t.Context(), "voltmpl"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"sandboxes", "snapshots", "mnt"} {
		if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "volumes", sub)); len(ents) != 0 {
			t.Errorf("volumes/%s holds %d entries after the template went", sub, len(ents))
		}
	}
}
