package e2b_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRealSDKIngressDNS serves the ingress's names over DNS
// (--ingress-dns) and has Node's resolver, pointed at it, resolve the host
// the unmodified E2B SDK's getHost builds, then fetch through the ingress
// at the address it answered (testdata/js/dns.mjs).
func TestRealSDKIngressDNS(t *testing.T) {
	dir := jsDir(t)
	ingress, domain := freeAddr(t), "clade.localhost"
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dnsAddr := pc.LocalAddr().String()
	pc.Close()
	d, url, key := startE2B(t, "--ingress", ingress, "--ingress-domain", domain, "--ingress-dns", dnsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "dns.mjs", "e2b")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "CLADE_INGRESS_DNS="+dnsAddr)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "PASS e2b") {
		t.Fatalf("resolving through --ingress-dns failed: %v\ndaemon log tail:\n%s", err, tail(d.Log(), 3000))
	}
}
