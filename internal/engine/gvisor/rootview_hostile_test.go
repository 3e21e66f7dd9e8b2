package gvisor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestViewHostilePaths: mount points a hostile image and volume paths
// aim at the host: symlinks the image ships that point out of it
// (absolute, and relative with '..'), the engine's own /.clade a symlink,
// a path through a file, many volumes at once, and concurrent creates.
// Whatever runsc makes lands in a sandbox's view: the image root and the
// host directory the symlinks name stay as they were; a create that
// fails leaves no mount and no directory.
func TestViewHostilePaths(t *testing.T) {
	runsc := testenv.Runsc(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	root := privateRoot(t, dir)
	outside := filepath.Join(dir, "host-outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs-out": outside,                                 // absolute, out of the image
		"rel-out": strings.Repeat("../", 20) + outside[1:], // relative, out through '..'
		"to-proc": "/proc/self",                            // into the sentry's /proc
		"loop-a":  "/loop-b",                               // a loop
		"loop-b":  "/loop-a",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The engine's own mount points through a symlink of the image.
	if err := os.RemoveAll(filepath.Join(root, ".clade")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(root, ".clade")); err != nil {
		t.Fatal(err)
	}
	before, beforeOut := tree(t, root), tree(t, outside)
	state := filepath.Join(dir, "state")
	e, err := gvisor.New(gvisor.Config{StateDir: state, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "f"), []byte("vol\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	try := func(dsts ...string) (engine.Sandbox, string, error) {
		n++
		spec := engine.Spec{ID: fmt.Sprintf("rhost%011d", n), RootFS: root, MemoryMiB: 128, Hostname: "h"}
		for _, d := range dsts {
			spec.Mounts = append(spec.Mounts, engine.Mount{Source: vol, Destination: d})
		}
		sb, err := e.Create(t.Context(), spec)
		if err != nil {
			if m := mountsUnder(t, dir); len(m) > 0 {
				t.Fatalf("a failed create (%v) left host mounts: %v", err, m)
			}
			if _, serr := os.Stat(filepath.Join(state, "sandboxes", spec.ID)); !os.IsNotExist(serr) {
				t.Fatalf("a failed create (%v) left its directory (%v)", err, serr)
			}
		} else {
			t.Cleanup(func() { e.Destroy(t.Context(), spec.ID) })
		}
		return sb, spec.ID, err
	}
	for _, dst := range []string{"/abs-out/x", "/rel-out/y/z", "/abs-out", "/to-proc/clade-x", "/loop-a/x", "/etc/passwd/x", "/etc/hostname/x"} {
		t.Run(strings.ReplaceAll(dst[1:], "/", "_"), func(t *testing.T) {
			sb, id, err := try(dst)
			if err == nil {
				r := enginetest.Exec(t, sb, "cat", dst+"/f")
				t.Logf("%s: created; cat: %q %q", dst, r.Stdout, r.Stderr)
				if err := e.Destroy(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			} else {
				t.Logf("%s: refused: %v", dst, err)
			}
			sameTree(t, dst, before, tree(t, root))
			sameTree(t, dst+" (the host directory a symlink names)", beforeOut, tree(t, outside))
		})
	}

	// Many volumes, deep, in one sandbox.
	var many []string
	for i := range 24 {
		many = append(many, fmt.Sprintf("/clade-many/%d/a/b/c", i))
	}
	sb, id, err := try(many...)
	if err != nil {
		t.Fatal(err)
	}
	if r := enginetest.Exec(t, sb, "cat", many[23]+"/f"); r.Stdout != "vol\n" {
		t.Fatalf("the 24th volume: %+v", r)
	}
	if err := e.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}

	// Concurrent creates needing views.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := engine.Spec{ID: fmt.Sprintf("rconc%011d", i), RootFS: root, MemoryMiB: 128, Hostname: "c",
				Mounts: []engine.Mount{{Source: vol, Destination: "/clade-conc/shared"}}}
			sb, err := e.Create(t.Context(), spec)
			if err == nil {
				if r := enginetest.Exec(t, sb, "cat", "/clade-conc/shared/f"); r.Stdout != "vol\n" {
					err = fmt.Errorf("reads %+v", r)
				}
			}
			errs[i] = errorsJoin(err, e.Destroy(t.Context(), spec.ID))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent create %d: %v", i, err)
		}
	}
	sameTree(t, "at the end", before, tree(t, root))
	sameTree(t, "at the end (outside)", beforeOut, tree(t, outside))
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Fatalf("host mounts left: %v", m)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "sandboxes")); len(ents) > 0 {
		t.Fatalf("sandbox directories left: %v", ents)
	}
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
