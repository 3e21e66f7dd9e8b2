package e2b_test

import (
	"net"
	"testing"
	"time"
)

// TestRealSDKIngressDNS serves the ingress's names over DNS
// (--ingress-dns) and has Node's resolver, pointed at it, resolve the host
// the unmodified E2B SDK's getHost builds, then fetch through the ingress
// at the address it answered (testdata/js/dns.mjs).
func TestRealSDKIngressDNS(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	jsDir(t)     // before the daemon: skips without node
	ingress, domain := freeAddr(t), "clade.localhost"
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dnsAddr := pc.LocalAddr().String()
	pc.Close()
	d, url, key := startE2B(t, "--ingress", ingress, "--ingress-domain", domain, "--ingress-dns", dnsAddr)
	runJS(t, d, url, key, 3*time.Minute, "dns.mjs", "e2b", "CLADE_INGRESS_DNS="+dnsAddr)
}
