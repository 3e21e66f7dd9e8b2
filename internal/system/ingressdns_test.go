package system

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestServeIngressDNSAnswer answers with the ingress's address, or with
// the DNS listener's when the ingress listens on every address, and
// refuses to start when neither names one.
func TestServeIngressDNSAnswer(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct{ ingress, dns, want string }{
		{"127.0.0.2:0", "127.0.0.1", "127.0.0.2"},
		{"0.0.0.0:0", "127.0.0.1", "127.0.0.1"},
		{"0.0.0.0:0", "0.0.0.0", ""},
	} {
		// A free port, for both the UDP and the TCP listener.
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
		pc.Close()
		dnsListen := net.JoinHostPort(tc.dns, port)
		ln, err := net.Listen("tcp", tc.ingress)
		if err != nil {
			t.Fatal(err)
		}
		stop, err := serveIngressDNS(Options{IngressDNS: dnsListen, IngressDomain: "clade.localhost"}, &ingressListener{Listener: ln}, log)
		if tc.want == "" {
			ln.Close()
			if err == nil || !strings.Contains(err.Error(), "every address") {
				t.Fatalf("%s/%s: %v, want a refusal", tc.ingress, tc.dns, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort("127.0.0.1", port)
		q := new(dns.Msg)
		q.SetQuestion("8000-x.clade.localhost.", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 10 * time.Second}).Exchange(q, addr)
		stop()
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != tc.want {
			t.Fatalf("%s/%s: %v, want %s", tc.ingress, tc.dns, r.Answer, tc.want)
		}
	}
}
