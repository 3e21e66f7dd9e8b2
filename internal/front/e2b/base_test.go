package e2b_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestBaseTemplate runs the unmodified E2B SDK against the `base` template
// on the e2b-base image: the tools E2B's base holds, the user `user` with
// passwordless sudo, and /home/user as the working directory.
func TestBaseTemplate(t *testing.T) {
	dir := jsDir(t)
	testenv.BuiltinImage(t, image.E2BBase)
	d, url, key := startE2B(t, "--e2b-base-image", image.E2BBase)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "base.mjs", "e2b")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "PASS e2b") {
		t.Fatalf("the base template failed: %v\ndaemon log tail:\n%s", err, tail(d.Log(), 3000))
	}
}
