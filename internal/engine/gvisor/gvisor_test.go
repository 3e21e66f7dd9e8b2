package gvisor_test

import (
	"os"
	"path/filepath"
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
