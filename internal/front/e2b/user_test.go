package e2b_test

import (
	"testing"
	"time"
)

// TestRealSDKUser runs the unmodified E2B JS SDK through E2B's users
// (testdata/js/user.mjs): commands and files as `user` unless the client
// asks for root, and the owners list and getInfo report.
func TestRealSDKUser(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	d, url, key := startE2B(t)
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) { runJS(t, d, url, key, 3*time.Minute, "user.mjs", mod) })
	}
}
