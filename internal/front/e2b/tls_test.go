package e2b_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRealSDKTLS runs the unmodified E2B JS SDK, at each pinned version,
// against the daemon's TLS ingress (testdata/js/tls.mjs), trusting the
// daemon's CA through NODE_EXTRA_CA_CERTS as E2B users are told to.
func TestRealSDKTLS(t *testing.T) {
	dir := jsDir(t)
	ingress, domain := freeAddr(t), "clade.localhost"
	d, url, key := startE2B(t, "--ingress", ingress, "--ingress-domain", domain, "--ingress-tls")
	ca, err := d.Client.IngressCA(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{"e2b", "e2b-2.50"} {
		t.Run(mod, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "tls.mjs", mod)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url,
				"CLADE_INGRESS_ADDR="+ingress, "CLADE_INGRESS_DOMAIN="+domain, "NODE_EXTRA_CA_CERTS="+caFile)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !strings.Contains(string(out), "PASS "+mod) {
				t.Fatalf("the E2B SDK %s failed against clade's TLS ingress: %v\ndaemon log tail:\n%s", mod, err, tail(d.Log(), 3000))
			}
		})
	}
}
