package e2b_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestCodeInterpreterSDK runs the unmodified @e2b/code-interpreter client
// through the E2B front against a real sandbox of the code-interpreter
// image.
func TestCodeInterpreterSDK(t *testing.T) {
	dir := jsDir(t)
	testenv.BuiltinImage(t, codeint.Image)
	d, url, key := startE2B(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "codeint.mjs")
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "PASS codeint") {
		t.Fatalf("@e2b/code-interpreter failed against clade: %v\ndaemon log tail:\n%s", err, tail(d.Log(), 3000))
	}
}
