package system

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// listenIngress checks the ingress options and listens on the ingress
// address.
func listenIngress(o Options) (net.Listener, error) {
	d := strings.Trim(o.IngressDomain, ".")
	if d == "" {
		return nil, errors.New("--ingress needs --ingress-domain: sandbox ports are served as PORT-ID.DOMAIN (e.g. --ingress-domain clade.localhost, whose names resolve to 127.0.0.1)")
	}
	ln, err := net.Listen("tcp", o.Ingress)
	if err != nil {
		return nil, fmt.Errorf("ingress: listen on %s: %w", o.Ingress, err)
	}
	return ln, nil
}

// ingressURL returns the URL template of a sandbox's ports behind the
// ingress listening on addr.
func ingressURL(addr net.Addr, domain string) func(id string) string {
	port := ingressPort(addr)
	domain = strings.Trim(domain, ".")
	return func(id string) string { return "http://{port}-" + id + "." + domain + port }
}

// ingressPort is ":PORT" for an ingress listening on another port than
// 80, else "".
func ingressPort(addr net.Addr) string {
	if ta, ok := addr.(*net.TCPAddr); ok && ta.Port != 80 {
		return fmt.Sprintf(":%d", ta.Port)
	}
	return ""
}
