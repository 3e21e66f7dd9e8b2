package e2b_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRealSDKPTY runs the unmodified E2B JS SDK through PTYs
// (testdata/js/pty.mjs): the agent's own terminals, resized at once after
// the start, input and output, exit codes, connect and kill.
func TestRealSDKPTY(t *testing.T) {
	dir := jsDir(t)
	d, url, key := startE2B(t)
	for _, mod := range []string{"e2b", "e2b-2.50"} {
		t.Run(mod, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "pty.mjs", mod)
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
