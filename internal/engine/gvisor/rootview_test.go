package gvisor_test

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// privateRoot is a copy of the default image's root made of hard links
// (new directories, the same files): what a sandbox's runsc makes in it
// shows up here, never in the shared image.
func privateRoot(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(testenv.ImagesDir(t), "default", "rootfs")
	root := filepath.Join(dir, "image-rootfs")
	if out, err := exec.Command("cp", "-al", src, root).CombinedOutput(); err != nil {
		t.Fatalf("copy the image root: %v: %s", err, out)
	}
	return root
}

// tree lists every path under root with its type and mode bits, sorted.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, strings.TrimPrefix(p, root)+" "+fi.Mode().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func sameTree(t *testing.T, when string, before, after []string) {
	t.Helper()
	if slices.Equal(before, after) {
		return
	}
	var added, gone []string
	for _, p := range after {
		if !slices.Contains(before, p) {
			added = append(added, p)
		}
	}
	for _, p := range before {
		if !slices.Contains(after, p) {
			gone = append(gone, p)
		}
	}
	t.Fatalf("%s: the image root changed: added %v, gone %v", when, added, gone)
}

// mountsUnder lists the host mounts (this namespace) under dir, but
// runsc's own null-netns.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") && !strings.HasSuffix(fields[4], "/null-netns") {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestMountPointsStayOutOfTheImage: a volume (a bind mount) at a path the
// image lacks, deep or not, a file mount at a missing path and a tmpfs:
// the sandbox sees them, its writes reach the volume's host directory, and
// the image's root is never written (runsc's gofer makes missing mount
// points as directories in the root it serves; they must land in a view
// of the sandbox's own), not while it runs, not after a checkpoint and a
// restore of a child elsewhere, not after rm; no host mount outlives the
// start; a later sandbox of the image without the volume has no such
// path. A volume at a directory the image has works as before.
func TestMountPointsStayOutOfTheImage(t *testing.T) {
	runsc := testenv.Runsc(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	root := privateRoot(t, dir)
	before := tree(t, root)
	state := filepath.Join(dir, "state")
	e, err := gvisor.New(gvisor.Config{StateDir: state, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	a, b, f := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "file")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f, []byte("a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := engine.Spec{ID: "rview00000000001", RootFS: root, MemoryMiB: 128, Hostname: "v",
		Mounts: []engine.Mount{
			{Source: a, Destination: "/clade-test-data"},
			{Source: a, Destination: "/srv/deep/er/vol", ReadOnly: true},
			{Source: f, Destination: "/etc/clade-test-file"},
			{Type: engine.MountTmpfs, Destination: "/run/clade-test-tmpfs"},
		}}
	sb, err := e.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), spec.ID) })
	r := enginetest.Exec(t, sb, "sh", "-c", "echo parent > /clade-test-data/f && cat /srv/deep/er/vol/f /etc/clade-test-file && echo t > /run/clade-test-tmpfs/x && cat /run/clade-test-tmpfs/x")
	if r.Stdout != "parent\na file\nt\n" {
		t.Fatalf("mounts inside: %+v", r)
	}
	if got, _ := os.ReadFile(filepath.Join(a, "f")); string(got) != "parent\n" {
		t.Fatalf("the volume's host directory holds %q", got)
	}
	sameTree(t, "while it runs", before, tree(t, root))
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Fatalf("host mounts left while the sandbox runs: %v", m)
	}
	img := filepath.Join(dir, "img")
	if err := e.Checkpoint(t.Context(), spec.ID, img, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", a+"/.", b).CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	child := spec
	child.ID = "rview00000000002"
	child.Mounts = slices.Clone(spec.Mounts)
	child.Mounts[0].Source, child.Mounts[1].Source = b, b
	sb2, err := e.Restore(t.Context(), child, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), child.ID) })
	if r := enginetest.Exec(t, sb2, "sh", "-c", "cat /clade-test-data/f /run/clade-test-tmpfs/x && echo child > /clade-test-data/f && sync"); r.Stdout != "parent\nt\n" {
		t.Fatalf("restored child reads %+v", r)
	}
	if got, _ := os.ReadFile(filepath.Join(b, "f")); string(got) != "child\n" {
		t.Fatalf("child's source holds %q", got)
	}
	sameTree(t, "after a restore elsewhere", before, tree(t, root))
	if err := e.Destroy(t.Context(), child.ID); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "after rm", before, tree(t, root))
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Fatalf("host mounts left after rm: %v", m)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "sandboxes")); len(ents) > 0 {
		t.Fatalf("sandbox directories left: %v", ents)
	}

	// A later sandbox of the image, without the volume.
	plain := engine.Spec{ID: "rview00000000003", RootFS: root, MemoryMiB: 128, Hostname: "p"}
	sb3, err := e.Create(t.Context(), plain)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), plain.ID) })
	if r := enginetest.Exec(t, sb3, "sh", "-c", "ls -d /clade-test-data /srv/deep /etc/clade-test-file /run/clade-test-tmpfs 2>/dev/null; echo end"); r.Stdout != "end\n" {
		t.Fatalf("a sandbox without the volume sees another's mount points: %+v", r)
	}

	// A volume at a directory the image has (/mnt), and one under a
	// symlink of the image (/var/run -> /run): both mounted, the image
	// unchanged.
	have := engine.Spec{ID: "rview00000000004", RootFS: root, MemoryMiB: 128, Hostname: "h",
		Mounts: []engine.Mount{{Source: a, Destination: "/mnt"}, {Source: b, Destination: "/var/run/clade-test-link"}}}
	sb4, err := e.Create(t.Context(), have)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), have.ID) })
	if r := enginetest.Exec(t, sb4, "sh", "-c", "cat /mnt/f /run/clade-test-link/f"); r.Stdout != "parent\nchild\n" {
		t.Fatalf("volumes at an existing directory and under a symlink: %+v", r)
	}
	for _, id := range []string{plain.ID, have.ID} {
		if err := e.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	sameTree(t, "at the end", before, tree(t, root))
}
