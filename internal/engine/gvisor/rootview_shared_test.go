package gvisor_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestViewSharedPropagation: on a host whose mounts are shared (systemd
// makes / shared), detaching a sandbox's view right after its start must
// not take the root away from its gofer (a copy in the gofer's mount
// namespace that the host's unmount could propagate to): the sandbox
// keeps reading its image and its volume, and a checkpoint and restore
// work, with the state dir on a shared mount.
func TestViewSharedPropagation(t *testing.T) {
	runsc := testenv.Runsc(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	root := privateRoot(t, dir)
	before := tree(t, root)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(state, state, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	if err := unix.Mount("", state, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	e, err := gvisor.New(gvisor.Config{StateDir: state, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := engine.Spec{ID: "rshared000000001", RootFS: root, MemoryMiB: 128, Hostname: "s",
		Mounts: []engine.Mount{{Source: vol, Destination: "/clade-shared/v"}}}
	sb, err := e.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Destroy(t.Context(), spec.ID) })
	check := func(sb engine.Sandbox, when string) {
		// New files of the image (never read before) and the volume.
		r := enginetest.Exec(t, sb, "sh", "-c", "cat /etc/os-release /usr/share/doc/*/copyright > /dev/null && echo x > /clade-shared/v/f && cat /clade-shared/v/f")
		if r.Stdout != "x\n" {
			t.Fatalf("%s: %+v", when, r)
		}
	}
	check(sb, "after the start")
	img := filepath.Join(dir, "img")
	if err := e.Checkpoint(t.Context(), spec.ID, img, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	sb, err = e.Restore(t.Context(), spec, img)
	if err != nil {
		t.Fatal(err)
	}
	check(sb, "after a restore")
	if err := e.Destroy(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "at the end", before, tree(t, root))
	if m := mountsUnder(t, dir); len(m) > 1 { // the shared state dir itself
		t.Fatalf("host mounts left: %v", m)
	}
}
