package volume_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// freshPaths returns volume paths the shared image does not have (one at
// the top, one deep under a directory it has), and removes, at the end,
// whatever of them a failing run left in the image.
func freshPaths(t *testing.T) (root string, paths []string) {
	t.Helper()
	root = filepath.Join(testenv.ImagesDir(t), "default", "rootfs")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	paths = []string{"/clade-test-" + tag, "/opt/clade-test-" + tag + "/deep"}
	for _, p := range paths {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Fatalf("%s is in the image already (%v): nothing to test", p, err)
		}
	}
	t.Cleanup(func() {
		// Only what this test's paths named, only empty directories.
		for _, p := range []string{paths[1], filepath.Dir(paths[1]), paths[0]} {
			_ = os.Remove(filepath.Join(root, p))
		}
	})
	return root, paths
}

func notInImage(t *testing.T, when, root string, paths []string) {
	t.Helper()
	for _, p := range paths {
		top := "/" + strings.Split(strings.TrimPrefix(p, "/"), "/")[0]
		if strings.HasPrefix(p, "/opt/") {
			top = "/opt/" + strings.Split(strings.TrimPrefix(p, "/opt/"), "/")[0]
		}
		if _, err := os.Lstat(filepath.Join(root, top)); !os.IsNotExist(err) {
			t.Fatalf("%s: %s is in the shared image root (%v): a sandbox's mount point was made there", when, top, err)
		}
	}
}

// TestVolumePathNotInImage: volumes at paths the image lacks (the usual
// case: /data, /srv/app/db) work through create, sleep and wake, snapshot
// and fork, and leave the shared image root as it was: no mount point
// made there while the sandbox runs, after rm, nor for a later sandbox of
// the image, which does not see the path; with --encrypt-at-rest too.
// No host mount is left after the daemon stops (the census).
func TestVolumePathNotInImage(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	for _, tc := range []struct {
		name string
		args []string
	}{{"plain", nil}, {"encrypted", []string{"--encrypt-at-rest"}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a daemon of its own
			if len(tc.args) > 0 {
				if _, err := exec.LookPath("gocryptfs"); err != nil {
					t.Skip("gocryptfs is not installed (make deps)")
				}
			}
			root, paths := freshPaths(t)
			d := testenv.StartDaemon(t, tc.args...)
			c := d.Client
			newVolume(t, c, "top", 16)
			newVolume(t, c, "deep", 16)
			sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "top", Path: paths[0]}, {Name: "deep", Path: paths[1]}}})
			mustSh(t, c, sb.ID, "echo one > "+paths[0]+"/f; echo two > "+paths[1]+"/f; nohup sleep 100000 > /dev/null 2>&1 & echo $! > /tmp/pid")
			notInImage(t, "while it runs", root, paths)

			if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Wake(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := mustSh(t, c, sb.ID, "kill -0 $(cat /tmp/pid) && cat "+paths[0]+"/f "+paths[1]+"/f"); got != "one\ntwo\n" {
				t.Fatalf("after a wake: %q", got)
			}
			notInImage(t, "after a wake", root, paths)

			snap, err := c.SnapshotSandbox(t.Context(), sb.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			mustSh(t, c, sb.ID, "kill -0 $(cat /tmp/pid) && echo parent > "+paths[0]+"/f")
			res, err := c.Fork(t.Context(), snap.ID, 1)
			if err != nil || len(res.Children) != 1 || res.Children[0].Error != "" {
				t.Fatalf("fork: %+v %v", res, err)
			}
			kid := res.Children[0].ID
			if got := mustSh(t, c, kid, "kill -0 $(cat /tmp/pid) && cat "+paths[0]+"/f "+paths[1]+"/f"); got != "one\ntwo\n" {
				t.Fatalf("the fork child reads %q, want the volumes as they were at the snapshot", got)
			}
			notInImage(t, "after a fork", root, paths)

			for _, id := range []string{kid, sb.ID} {
				if err := c.DeleteSandbox(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.DeleteSnapshot(t.Context(), snap.ID); err != nil {
				t.Fatal(err)
			}
			notInImage(t, "after rm", root, paths)
			other := create(t, c, sdk.CreateSandboxRequest{})
			if got := sh(t, c, other.ID, "ls -d "+paths[0]+" "+filepath.Dir(paths[1])+" 2>&1"); got.code == 0 {
				t.Fatalf("a later sandbox without the volumes sees their paths: %q", got.stdout)
			}
			// The volumes kept their data.
			again := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "top", Path: paths[0]}}})
			if got := mustSh(t, c, again.ID, "cat "+paths[0]+"/f"); got != "parent\n" {
				t.Fatalf("the volume in a new sandbox: %q", got)
			}
			for _, id := range []string{other.ID, again.ID} {
				if err := c.DeleteSandbox(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			}
			d.Stop()
			if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
				t.Fatalf("leaks: %v\n%s", leaks, d.Log())
			}
			notInImage(t, "at the end", root, paths)
		})
	}
}

// TestVolumeViewDaemonKill: a daemon killed (SIGKILL) while a new
// sandbox's root view is mounted on the host, before runsc ran: the next
// daemon detaches it and removes the half-made sandbox; nothing leaks and
// the image root is untouched. A sandbox with a view running across a
// kill keeps working (its gofer holds the view; the host holds nothing).
func TestVolumeViewDaemonKill(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	root, paths := freshPaths(t)
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "v", 16)
	newVolume(t, c, "w", 16)
	running := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "w", Path: paths[1]}}})
	mustSh(t, c, running.ID, "echo kept > "+paths[1]+"/f")
	d.Kill()
	d.Start([]string{"CLADE_CRASH_AT=gvisor-view-mounted"})
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: paths[0]}}}); err == nil {
		t.Fatal("the create succeeded; the daemon should have crashed in it")
	}
	_ = d.Wait()
	if m := mountsOf(d.DataDir, "/gvisor/sandboxes/"); len(m) == 0 {
		t.Fatal("the killed daemon left no view mounted: the crash point is not where the test thinks")
	}
	d.Start(nil)
	if m := mountsOf(d.DataDir, "/gvisor/sandboxes/"); len(m) > 0 {
		t.Fatalf("views still mounted after the restart: %v", m)
	}
	// As a client is told to: the restarted daemon answers Unavailable
	// ("retry") until the sandbox's agent has dialled back in.
	testenv.AwaitExec(t, c, running.ID)
	if got := mustSh(t, c, running.ID, "cat "+paths[1]+"/f"); got != "kept\n" {
		t.Fatalf("the running sandbox after two restarts reads %q", got)
	}
	sbs, err := c.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.ID != running.ID {
			if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: paths[0]}}})
	mustSh(t, c, sb.ID, "echo ok > "+paths[0]+"/f")
	for _, id := range []string{sb.ID, running.ID} {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	d.Stop()
	if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
		t.Fatalf("leaks: %v\n%s", leaks, d.Log())
	}
	notInImage(t, "at the end", root, paths)
}

// mountsOf lists the mount points under dataDir whose path contains sub.
func mountsOf(dataDir, sub string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dataDir+"/") && strings.Contains(f[4], sub) && !strings.HasSuffix(f[4], "/null-netns") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestVolumeViewForksOutliveParent: children forked (three at once) from
// a snapshot of a sandbox whose volumes need a root view keep working
// after the parent is removed, and across a daemon
// killed while they run; concurrent creates needing views work; after
// rm nothing is left: no mount, no sandbox directory, nothing in the
// shared image root.
func TestVolumeViewForksOutliveParent(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	root, paths := freshPaths(t)
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "v", 16)
	parent := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: paths[1]}}})
	mustSh(t, c, parent.ID, "echo snap > "+paths[1]+"/f")
	snap, err := c.SnapshotSandbox(t.Context(), parent.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(t.Context(), snap.ID, 3)
	if err != nil || len(res.Children) != 3 {
		t.Fatalf("fork: %+v %v", res, err)
	}
	if err := c.DeleteSandbox(t.Context(), parent.ID); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		for _, k := range res.Children {
			if k.Error != "" {
				t.Fatalf("fork child: %s", k.Error)
			}
			if got := mustSh(t, c, k.ID, "cat "+paths[1]+"/f"); got != "snap\n" {
				t.Fatalf("%s: child %s reads %q", when, k.ID, got)
			}
		}
		notInImage(t, when, root, paths)
	}
	check("after the parent's rm")
	d.Kill()
	d.Start(nil)
	check("after a daemon kill")
	var wg sync.WaitGroup
	ids := make([]string, 3)
	errs := make([]error, 3)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: paths[0]}}})
			ids[i], errs[i] = sb.ID, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent create %d: %v", i, err)
		}
		if got := mustSh(t, c, ids[i], "cat "+paths[0]+"/f"); got != "snap\n" {
			t.Fatalf("concurrent create %d reads %q", i, got)
		}
	}
	for _, k := range res.Children {
		ids = append(ids, k.ID)
	}
	for _, id := range ids {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(t.Context(), snap.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "gvisor", "sandboxes")); len(ents) > 0 {
		t.Fatalf("sandbox directories left after rm: %v", ents)
	}
	d.Stop()
	if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
		t.Fatalf("leaks: %v\n%s", leaks, d.Log())
	}
	notInImage(t, "at the end", root, paths)
}

// TestVolumeViewCrashPoints: the daemon killed (SIGKILL) at points of a
// sleep, a wake, a fork and a snapshot of a sandbox whose volume needs a root
// view: the next daemon holds no view mounted on the host, every sandbox
// it records can be woken or removed, and after rm nothing leaks and the
// shared image root is untouched.
func TestVolumeViewCrashPoints(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	root, paths := freshPaths(t)
	d := testenv.StartDaemon(t)
	c := d.Client
	newVolume(t, c, "v", 16)
	for _, point := range []string{"wake-before-engine", "sleep-after-checkpoint", "snapshot-before-restore", "fork-mid-restore"} {
		t.Run(point, func(t *testing.T) {
			sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: paths[1]}}})
			mustSh(t, c, sb.ID, "echo "+point+" > "+paths[1]+"/f")
			var snapID string
			switch point {
			case "wake-before-engine":
				if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
					t.Fatal(err)
				}
			case "fork-mid-restore":
				snap, err := c.SnapshotSandbox(t.Context(), sb.ID, "")
				if err != nil {
					t.Fatal(err)
				}
				snapID = snap.ID
			}
			d.Kill()
			d.Start([]string{"CLADE_CRASH_AT=" + point})
			var err error
			switch point {
			case "wake-before-engine":
				_, err = c.Wake(t.Context(), sb.ID)
			case "sleep-after-checkpoint":
				_, err = c.Sleep(t.Context(), sb.ID)
			case "snapshot-before-restore":
				_, err = c.SnapshotSandbox(t.Context(), sb.ID, "")
			case "fork-mid-restore":
				_, err = c.Fork(t.Context(), snapID, 2)
			}
			if err == nil {
				t.Fatalf("%s: the call succeeded; the daemon should have crashed in it", point)
			}
			_ = d.Wait()
			d.Start(nil)
			if m := mountsOf(d.DataDir, "/gvisor/sandboxes/"); len(m) > 0 {
				t.Fatalf("views mounted after the restart: %v", m)
			}
			sbs, err := c.ListSandboxes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sbs {
				if s.ID == sb.ID {
					// A sandbox the restarted daemon reattached answers
					// "retry" until its agent has dialled back in.
					testenv.AwaitExec(t, c, s.ID)
					if got := mustSh(t, c, s.ID, "cat "+paths[1]+"/f"); got != point+"\n" {
						t.Fatalf("the sandbox after the crash reads %q", got)
					}
				}
				if err := c.DeleteSandbox(t.Context(), s.ID); err != nil {
					t.Fatalf("rm %s (%s): %v", s.ID, s.State, err)
				}
			}
			snaps, err := c.ListSnapshots(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, sn := range snaps {
				if err := c.DeleteSnapshot(t.Context(), sn.ID); err != nil {
					t.Fatal(err)
				}
			}
			if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "gvisor", "sandboxes")); len(ents) > 0 {
				t.Fatalf("sandbox directories left after rm: %v", ents)
			}
			notInImage(t, point, root, paths)
		})
	}
	d.Stop()
	if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
		t.Fatalf("leaks: %v\n%s", leaks, d.Log())
	}
}
