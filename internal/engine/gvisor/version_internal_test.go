package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunscVersionHungRunsc: a runsc that never answers --version makes
// RunscVersion say "unknown" in bounded time; before, the daemon's first
// read (no deadline) held the lock for ever and every health call after
// it hung.
func TestRunscVersionHungRunsc(t *testing.T) {
	runsc := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(runsc, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { runscVersionWait = d }(runscVersionWait)
	runscVersionWait = 200 * time.Millisecond
	e := &Engine{cfg: Config{Runsc: runsc}}
	got := make(chan string, 2)
	for range 2 {
		go func() { got <- e.RunscVersion(context.Background()) }()
	}
	for range 2 {
		select {
		case v := <-got:
			if v != "unknown" {
				t.Fatalf("RunscVersion = %q, want unknown", v)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("RunscVersion still waiting on a runsc that hangs")
		}
	}
}
