package e2b_test

import (
	"testing"
	"time"
)

// TestRealSDKPTY runs the unmodified E2B JS SDK through PTYs
// (testdata/js/pty.mjs): the agent's own terminals, resized at once after
// the start, input and output, exit codes, connect and kill.
func TestRealSDKPTY(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	d, url, key := startE2B(t)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) { runJS(t, d, url, key, 4*time.Minute, "pty.mjs", mod) })
	}
}
