package e2b_test

import (
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestCodeInterpreterSDK runs the unmodified @e2b/code-interpreter client
// through the E2B front against a real sandbox of the code-interpreter
// image.
func TestCodeInterpreterSDK(t *testing.T) {
	// Not parallel: its sandbox's first run starts a Python kernel, all
	// CPU, and beside another test it passed the SDK's request timeout
	// under load.
	jsDir(t) // before the daemon: skips without node
	testenv.BuiltinImage(t, codeint.Image)
	d, url, key := startE2B(t)
	runJS(t, d, url, key, 5*time.Minute, "codeint.mjs", "codeint")
}
