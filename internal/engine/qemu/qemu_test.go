//go:build qemu

// The qemu engine's tests boot real VMs; under TCG (software emulation)
// they are slow and CPU-hungry, so they run only with -tags qemu
// (`make test-qemu`), never in `make test`.
package qemu_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/qemu"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// newEngine makes an engine on dir, skipping the test when QEMU or the
// guest kernel is missing.
func newEngine(t *testing.T, dir string) *qemu.Engine {
	t.Helper()
	_, agent := testenv.Binaries(t)
	// A boot under TCG on a loaded host can take a minute and more.
	cfg := qemu.Config{StateDir: dir, AgentPath: agent, Log: logger(), ReadyTimeout: 3 * time.Minute}
	// CLADE_QEMU_TCG_CACHE sets the translation cache (MiB) of every VM of the tests.
	cfg.TCGCacheMiB, _ = strconv.Atoi(os.Getenv("CLADE_QEMU_TCG_CACHE"))
	e, err := qemu.New(cfg)
	if err != nil {
		t.Fatalf("qemu engine: %v (run `make deps-qemu`)", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// logger is the engine's debug log (per-phase times of boots, checkpoints
// and restores) on stderr when CLADE_QEMU_LOG is set, else nil (none).
func logger() *slog.Logger {
	if os.Getenv("CLADE_QEMU_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func rootFS(t *testing.T) string {
	return filepath.Join(testenv.ImagesDir(t), "default", "rootfs")
}

func TestConformance(t *testing.T) {
	env := enginetest.Env{
		RootFS:   rootFS(t),
		StateDir: func(t *testing.T) string { return testenv.TempDir(t) },
	}
	enginetest.Run(t, env, func(t *testing.T, dir string) engine.Engine {
		e := newEngine(t, dir)
		t.Cleanup(func() { assertNoLeaks(t, e, dir) })
		return e
	})
}

// assertNoLeaks fails when a QEMU process or a guest memory file of the
// engine on dir outlived the test.
func assertNoLeaks(t *testing.T, e *qemu.Engine, dir string) {
	t.Helper()
	if m := e.MemFiles(); len(m) > 0 {
		t.Errorf("guest memory files left: %v", m)
	}
	if left := testenv.ProcessesMentioning(dir + "/sandboxes/"); len(left) > 0 {
		t.Errorf("qemu processes left: %v", left)
	}
}
