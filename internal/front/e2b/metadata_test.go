package e2b_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRealSDKMetadata runs the unmodified E2B JS SDK through file
// metadata on upload (envd 0.6.2; testdata/js/metadata.mjs).
func TestRealSDKMetadata(t *testing.T) {
	dir := jsDir(t)
	d, url, key := startE2B(t)
	for _, mod := range []string{"e2b", "e2b-2.50"} {
		t.Run(mod, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "metadata.mjs", mod)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !strings.Contains(string(out), "PASS "+mod) {
				t.Fatalf("the E2B SDK %s failed against clade: %v\ndaemon log tail:\n%s", mod, err, tail(d.Log(), 3000))
			}
		})
	}
}
