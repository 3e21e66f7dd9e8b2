package codeint_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestServerDelivered: the server that runs is the daemon's, not the one
// an image built (and cached) by an older clade holds. Here the image's
// server is one that cannot serve at all; hot-pool, cold and forked
// sandboxes of that image all run the daemon's.
func TestServerDelivered(t *testing.T) {
	shared := testenv.BuiltinImage(t, codeint.Image)
	dir := testenv.TempDir(t)
	for _, name := range []string{"default", codeint.Image} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		// Hard links: no copy of the roots; the server is replaced below,
		// never written through a link.
		if out, err := exec.Command("cp", "-al", filepath.Join(shared, name, "rootfs"), filepath.Join(dir, name, "rootfs")).CombinedOutput(); err != nil {
			t.Skipf("cannot link the %s image's root: %v %s", name, err, out)
		}
		b, err := os.ReadFile(filepath.Join(shared, name, "image.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "image.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stale := filepath.Join(dir, codeint.Image, "rootfs", codeint.ServerPath)
	if err := os.Remove(stale); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("#!/usr/bin/python3\nimport sys\nsys.exit('stale server of an older image')\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(codeint.ServerSource())
	want := hex.EncodeToString(sum[:])

	d := testenv.StartDaemon(t, "--images-dir", dir, "--hot-pool", "default=0,"+codeint.Image+"=1")
	c := d.Client
	waitHot(t, d, 1, 3*time.Minute)
	check := func(id, what string) {
		t.Helper()
		if ex := run(t, c, id, sdk.RunCodeRequest{Code: "6 * 7"}); ex.Text() != "42" {
			t.Fatalf("%s: 6 * 7 = %q %+v", what, ex.Text(), ex.Error)
		}
		out, code := execOut(t, c, id, "sha256sum "+codeint.RunServerPath+"; curl -s localhost:49999/health; echo; grep -c stale "+codeint.ServerPath)
		if code != 0 || !strings.HasPrefix(out, want+" ") || !strings.Contains(out, `"server": "`+want+`"`) || !strings.HasSuffix(out, "\n1\n") {
			t.Fatalf("%s: the running server is not the daemon's (sha256 %s): %q", what, want, out)
		}
	}
	hot, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image})
	if err != nil {
		t.Fatal(err)
	}
	check(hot.ID, "a hot-pool sandbox")
	cold, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{Image: codeint.Image, MemoryMiB: 768})
	if err != nil {
		t.Fatal(err)
	}
	check(cold.ID, "a cold sandbox")
	run(t, c, cold.ID, sdk.RunCodeRequest{Code: "v = 'kept'"})
	fr, err := c.Fork(context.Background(), cold.ID, 1)
	if err != nil || len(fr.Children) != 1 || fr.Children[0].ID == "" {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	if ex := run(t, c, fr.Children[0].ID, sdk.RunCodeRequest{Code: "v"}); ex.Text() != "'kept'" {
		t.Fatalf("fork child: %q %+v", ex.Text(), ex.Error)
	}
	check(fr.Children[0].ID, "a fork child")
}
