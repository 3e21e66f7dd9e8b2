package e2b_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRealSDKTLS runs the unmodified E2B JS SDK, at each pinned version,
// against the daemon's TLS ingress (testdata/js/tls.mjs), trusting the
// daemon's CA through NODE_EXTRA_CA_CERTS as E2B users are told to.
func TestRealSDKTLS(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
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
	for _, mod := range sdkModules {
		t.Run(mod, func(t *testing.T) {
			runJS(t, d, url, key, 3*time.Minute, "tls.mjs", mod, "CLADE_INGRESS_ADDR="+ingress, "CLADE_INGRESS_DOMAIN="+domain, "NODE_EXTRA_CA_CERTS="+caFile)
		})
	}
}
