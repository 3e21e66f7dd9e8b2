package e2b_test

import (
	"testing"
	"time"
)

// TestRealSDKLifecycle runs the unmodified E2B JS SDK, at each pinned
// version, through the lifecycle details (testdata/js/lifecycle.mjs):
// Sandbox.list's order, startedAfter and template, getMetrics over a
// range of the history, a command whose sandbox is killed.
func TestRealSDKLifecycle(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	d, url, key := startE2B(t)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) { runJS(t, d, url, key, 5*time.Minute, "lifecycle.mjs", mod) })
	}
}
