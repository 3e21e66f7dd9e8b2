package gvisor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestViewFullDisk: the sandboxes' file system out of inodes at every
// step of a create that needs a root view (its directory, the view's
// directories, overlayfs's work directory, the mount points runsc makes
// in the upper layer, runsc's own files): each create either works or
// fails leaving no host mount and no directory, and the image root is
// never written.
func TestViewFullDisk(t *testing.T) {
	testenv.Slow(t)
	runsc := testenv.Runsc(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	root := privateRoot(t, dir)
	before := tree(t, root)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=256m,nr_inodes=4096,mode=0700"); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	e, err := gvisor.New(gvisor.Config{StateDir: state, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	fill := filepath.Join(state, "fill")
	ok := 0
	for free := 0; free <= 48 && ok < 2; free++ {
		if err := os.Mkdir(fill, 0o700); err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			var st unix.Statfs_t
			if err := unix.Statfs(state, &st); err != nil {
				t.Fatal(err)
			}
			if int(st.Ffree) <= free {
				break
			}
			if err := os.WriteFile(filepath.Join(fill, fmt.Sprint(i)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		spec := engine.Spec{ID: fmt.Sprintf("rfull%011d", free), RootFS: root, MemoryMiB: 128, Hostname: "f",
			Mounts: []engine.Mount{{Source: vol, Destination: "/clade-full/a/b"}, {Source: vol, Destination: "/clade-full/c"}}}
		sb, err := e.Create(t.Context(), spec)
		if err == nil {
			ok++
			if r := enginetest.Exec(t, sb, "sh", "-c", "ls -d /clade-full/a/b && echo yes"); r.Stdout != "/clade-full/a/b\nyes\n" {
				t.Errorf("%d free inodes: created, but %+v", free, r)
			}
		} else {
			t.Logf("%d free inodes: %v", free, err)
			if strings.Contains(err.Error(), "mount a view") && !errdefs.Is(err, errdefs.ResourceExhausted) {
				t.Errorf("%d free inodes: the view's mount failed with %v (class %q), want ResourceExhausted", free, err, errdefs.ClassOf(err))
			}
		}
		if err := os.RemoveAll(fill); err != nil {
			t.Fatal(err)
		}
		if err := e.Destroy(t.Context(), spec.ID); err != nil {
			t.Fatalf("%d free inodes: destroy: %v", free, err)
		}
		if m := mountsUnder(t, dir); len(m) > 1 { // the tmpfs itself
			t.Fatalf("%d free inodes: host mounts left: %v", free, m)
		}
		if ents, _ := os.ReadDir(filepath.Join(state, "sandboxes")); len(ents) > 0 {
			t.Fatalf("%d free inodes: sandbox directories left: %v", free, ents)
		}
		sameTree(t, fmt.Sprintf("%d free inodes", free), before, tree(t, root))
	}
	if ok == 0 {
		t.Fatal("no create worked even with 48 free inodes: the test does not reach a start")
	}
}
