package system

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/clade-sandbox/clade/internal/ingress"
)

// ingressListener is the ingress's listener and, with TLS on, its TLS
// configuration and (with the daemon's own CA) the CA's certificate.
type ingressListener struct {
	net.Listener
	tls   *tls.Config
	caPEM []byte
}

// listenIngress checks the ingress options, prepares its TLS certificate
// when TLS is on and listens on the ingress address.
func listenIngress(o Options, log *slog.Logger) (*ingressListener, error) {
	d := strings.Trim(o.IngressDomain, ".")
	if d == "" {
		return nil, errors.New("--ingress needs --ingress-domain: sandbox ports are served as PORT-ID.DOMAIN (e.g. --ingress-domain clade.localhost; see docs/e2b.md for making its names resolve)")
	}
	il := &ingressListener{}
	if (o.IngressTLSCert == "") != (o.IngressTLSKey == "") {
		return nil, errors.New("--ingress-tls-cert and --ingress-tls-key go together: give both, or neither for the daemon's own CA")
	}
	switch {
	case o.IngressTLSCert != "":
		c, err := ingress.LoadKeyPair(o.IngressTLSCert, o.IngressTLSKey)
		if err != nil {
			return nil, err
		}
		il.tls = ingress.TLSConfig(c)
	case o.IngressTLS:
		ca, replaced, err := ingress.LoadCA(o.DataDir, d)
		if err != nil {
			return nil, err
		}
		if replaced {
			log.Warn("the ingress domain changed: made a new local CA for it; clients must trust the new one (clade ca)", "domain", d, "ca", filepath.Join(o.DataDir, ingress.CACertFile))
		}
		c, err := ca.Leaf(d)
		if err != nil {
			return nil, err
		}
		il.tls, il.caPEM = ingress.TLSConfig(c), ca.PEM
	}
	ln, err := net.Listen("tcp", o.Ingress)
	if err != nil {
		return nil, fmt.Errorf("ingress: listen on %s: %w", o.Ingress, err)
	}
	il.Listener = ln
	return il, nil
}

// scheme is the ingress's URL scheme.
func (il *ingressListener) scheme() string {
	if il.tls != nil {
		return "https"
	}
	return "http"
}

// url returns the URL template of a sandbox's ports behind the ingress.
func (il *ingressListener) url(domain string) func(id string) string {
	port := il.port()
	domain = strings.Trim(domain, ".")
	prefix := il.scheme() + "://{port}-"
	return func(id string) string { return prefix + id + "." + domain + port }
}

// port is ":PORT" for an ingress listening on another port than its
// scheme's (80, or 443 with TLS), else "".
func (il *ingressListener) port() string {
	def := 80
	if il.tls != nil {
		def = 443
	}
	if ta, ok := il.Addr().(*net.TCPAddr); ok && ta.Port != def {
		return fmt.Sprintf(":%d", ta.Port)
	}
	return ""
}

// serveIngressDNS serves the ingress's names over DNS on o.IngressDNS
// (UDP and TCP), answering with the ingress's address, or with the DNS
// listener's own when the ingress listens on every address.
func serveIngressDNS(o Options, iln *ingressListener, log *slog.Logger) (stop func(), err error) {
	pc, err := net.ListenPacket("udp", o.IngressDNS)
	if err != nil {
		return nil, fmt.Errorf("--ingress-dns: listen on %s: %w", o.IngressDNS, err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("--ingress-dns: listen on TCP %s: %w", pc.LocalAddr(), err)
	}
	closeBoth := func() { pc.Close(); ln.Close() }
	answer := addrOf(iln.Addr())
	if !answer.IsValid() || answer.IsUnspecified() {
		answer = addrOf(pc.LocalAddr())
	}
	if !answer.IsValid() || answer.IsUnspecified() {
		closeBoth()
		return nil, fmt.Errorf("--ingress-dns: the ingress listens on every address (%s), so its names have no one address to resolve to: give --ingress or --ingress-dns a specific address", iln.Addr())
	}
	s, err := ingress.NewDNS(ingress.DNSConfig{Domain: o.IngressDomain, Addrs: []netip.Addr{answer}, Log: log})
	if err != nil {
		closeBoth()
		return nil, err
	}
	s.Serve(pc, ln)
	log.Info("serving the ingress's names over DNS", "addr", pc.LocalAddr().String(), "domain", o.IngressDomain, "answer", answer)
	return s.Close, nil
}

// addrOf is a listener's IP address (zero for anything else).
func addrOf(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
