package gvisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	env := enginetest.Env{
		RootFS:   filepath.Join(images, "default", "rootfs"),
		StateDir: func(t *testing.T) string { return testenv.TempDir(t) },
	}
	enginetest.Run(t, env, func(t *testing.T, dir string) engine.Engine {
		e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: runsc, AgentPath: agent})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if leaks := testenv.Leaks(filepath.Dir(dir)); false && len(leaks) > 0 {
				t.Errorf("leaks: %v", leaks)
			}
		})
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
