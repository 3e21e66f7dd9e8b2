package e2b_test

import (
	"testing"
	"time"
)

// TestRealSDKFiles runs the unmodified E2B JS SDK through E2B's file
// behaviour (testdata/js/files.mjs): signed file URLs fetched with no
// header, through E2B_SANDBOX_URL; a missing path removed; sorted
// listings; absolute symlink targets; makeDir/rename/remove as the user.
func TestRealSDKFiles(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	d, url, key := startE2B(t)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) { runJS(t, d, url, key, 3*time.Minute, "files.mjs", mod) })
	}
}
