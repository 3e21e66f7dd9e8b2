package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(gvisor.FakeProcessEnv) != "" {
		// A stand-in for a runsc process (orphans_internal_test.go): it
		// only has to live, with the command line it was given, until
		// it is killed.
		for {
			time.Sleep(time.Hour)
		}
	}
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	env := enginetest.Env{
		RootFS: filepath.Join(images, "default", "rootfs"),
		// Its check runs after every sandbox of the subtest is destroyed
		// (cleanups run last first; the subtest asks for its dir first).
		StateDir: func(t *testing.T) string {
			dir := testenv.TempDir(t)
			t.Cleanup(func() {
				// Processes and mounts: the dir's own files are the
				// test's (images it took) and go with it.
				if leaks := testenv.ProcessesMentioning(dir); len(leaks) > 0 {
					t.Errorf("processes left: %v", leaks)
				}
				if mounts := testenv.MountsUnder(dir); len(mounts) > 0 {
					t.Errorf("mounts left: %v", mounts)
				}
			})
			return dir
		},
	}
	stateDirs := map[engine.Engine]string{}
	env.DiskUsage = func(t *testing.T, e engine.Engine, id string) int64 { return diskUsage(t, stateDirs[e], id) }
	enginetest.Run(t, env, func(t *testing.T, dir string) engine.Engine {
		e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: runsc, AgentPath: agent})
		if err != nil {
			t.Fatal(err)
		}
		stateDirs[e] = dir
		return e
	})
}

// TestDestroyKillsLostProcesses: a sandbox whose runsc state is gone (a
// create killed half way) still has its processes killed by Destroy.
func TestDestroyKillsLostProcesses(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	id := "lost000000000001"
	if _, err := e.Create(t.Context(), engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 128, Hostname: "lost"}); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "runsc"))
	for _, d := range ents {
		if strings.Contains(d.Name(), id) {
			os.RemoveAll(filepath.Join(dir, "runsc", d.Name()))
		}
	}
	if len(testenv.ProcessesMentioning(id)) == 0 {
		t.Fatal("no sandbox processes to begin with")
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if left := testenv.ProcessesMentioning(id); len(left) != 0 {
		t.Fatalf("processes outlived Destroy: %v", left)
	}
}

// diskUsage sums the allocated blocks of the files in the sandbox's state
// directory and of the files sandbox processes hold open there, unlinked
// ones included (runsc's overlay filestore is unlinked at once).
func diskUsage(t *testing.T, stateDir, id string) int64 {
	dir := filepath.Join(stateDir, "sandboxes", id)
	seen := map[[2]uint64]bool{}
	var total int64
	add := func(fi os.FileInfo) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || !fi.Mode().IsRegular() {
			return
		}
		k := [2]uint64{st.Dev, st.Ino}
		if !seen[k] {
			seen[k] = true
			total += st.Blocks * 512
		}
	}
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			add(fi)
		}
		return nil
	})
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, dir+"/") {
			if fi, err := os.Stat(fd); err == nil {
				add(fi)
			}
		}
	}
	return total
}

// TestNoWritableHostDir: nothing a sandbox writes lands in a host directory
// (which the disk cap would not bound); the agent's socket directory is
// read-only inside.
func TestNoWritableHostDir(t *testing.T) {
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	e, err := gvisor.New(gvisor.Config{StateDir: testenv.TempDir(t), Runsc: testenv.Runsc(t), AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	id := "rodir00000000001"
	sb, err := e.Create(t.Context(), engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 128, DiskMiB: 32, Hostname: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
	r := enginetest.Exec(t, sb, "sh", "-c", `for d in /.clade/run /.clade/bin; do echo x > $d/f 2>/dev/null && echo "$d writable"; done; echo done`)
	if r.Stdout != "done\n" {
		t.Fatalf("host directories writable inside: %+v", r)
	}
}

// TestCloseUnmountsNullNetNS: Close unmounts the null-netns runsc pins
// under the state dir; the sandbox keeps running, and a new engine on the
// same dir attaches to it and creates more.
func TestCloseUnmountsNullNetNS(t *testing.T) {
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	runsc := testenv.Runsc(t)
	dir := testenv.TempDir(t)
	rootfs := filepath.Join(images, "default", "rootfs")
	newEngine := func() *gvisor.Engine {
		e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: runsc, AgentPath: agent})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	mounted := func() bool {
		b, err := os.ReadFile("/proc/self/mounts")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), " "+filepath.Join(dir, "runsc", "null-netns")+" ")
	}
	e1 := newEngine()
	spec := engine.Spec{ID: "netns0000000001a", RootFS: rootfs, MemoryMiB: 128, Hostname: "a"}
	if _, err := e1.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e1.Destroy(context.Background(), spec.ID) })
	if !mounted() {
		t.Fatal("no null-netns mount after a create: nothing to test")
	}
	if err := e1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if mounted() {
		t.Fatal("null-netns still mounted after Close")
	}
	e2 := newEngine()
	sb, err := e2.Attach(t.Context(), spec)
	if err != nil {
		t.Fatalf("attach after close: %v", err)
	}
	if r := enginetest.Exec(t, sb, "hostname"); r.Stdout != "a\n" {
		t.Fatalf("after close and attach: %+v", r)
	}
	spec2 := engine.Spec{ID: "netns0000000002b", RootFS: rootfs, MemoryMiB: 128, Hostname: "b"}
	sb2, err := e2.Create(t.Context(), spec2)
	if err != nil {
		t.Fatalf("create after close: %v", err)
	}
	t.Cleanup(func() { _ = e2.Destroy(context.Background(), spec2.ID) })
	if r := enginetest.Exec(t, sb2, "hostname"); r.Stdout != "b\n" {
		t.Fatalf("created after close: %+v", r)
	}
	for _, id := range []string{spec.ID, spec2.ID} {
		if err := e2.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e2.Close(); err != nil || mounted() {
		t.Fatalf("second close: %v, mounted %v", err, mounted())
	}
}
