package e2b_test

import (
	"testing"
	"time"
)

// TestRealSDKMetadata runs the unmodified E2B JS SDK through file
// metadata on upload (envd 0.6.2; testdata/js/metadata.mjs).
func TestRealSDKMetadata(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	d, url, key := startE2B(t)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) { runJS(t, d, url, key, 3*time.Minute, "metadata.mjs", mod) })
	}
}
