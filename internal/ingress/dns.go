package ingress

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DNS answers for the ingress's names, so that PORT-ID.DOMAIN resolves for
// programs that ask the configured DNS server (glibc's resolver, and so
// Node and Python, on a host without a resolver that knows the domain).
// It is authoritative for DOMAIN and every name under it, which it
// answers with the ingress's addresses; it refuses every other name and
// never forwards or recurses, so pointing a resolver at it for the domain
// reaches nothing else. Queries are untrusted: anything malformed is
// refused or dropped, answers are never bigger than a small query could
// make them, and TCP connections are capped.
type DNS struct {
	domain string // lower case, no dots at the ends
	v4, v6 []netip.Addr
	log    *slog.Logger
	srvs   []*dns.Server
}

// DNSConfig configures the ingress's DNS server.
type DNSConfig struct {
	// Domain is the ingress's domain (--ingress-domain).
	Domain string
	// Addrs are what its names resolve to: the ingress's address(es).
	Addrs []netip.Addr
	Log   *slog.Logger
}

// Limits of the DNS server.
const (
	// dnsTTL is the TTL of answers: the addresses never change while the
	// daemon runs, and a restart on another address is seen within it.
	dnsTTL = 30
	// dnsMaxTCP is how many TCP connections are served at once; more are
	// closed at once (a resolver uses TCP only after a truncated answer,
	// which this server never sends).
	dnsMaxTCP = 64
	// dnsTCPTimeout bounds a TCP connection's reads and idle time.
	dnsTCPTimeout = 5 * time.Second
	// dnsUDPSize is the largest UDP answer: EDNS's size of DNS flag day
	// 2020 (the answers are far smaller anyway).
	dnsUDPSize = 1232
)

// NewDNS checks cfg and returns a server (not yet serving).
func NewDNS(cfg DNSConfig) (*DNS, error) {
	d := strings.ToLower(strings.Trim(cfg.Domain, "."))
	if d == "" {
		return nil, errors.New("ingress DNS: no domain: give --ingress-domain")
	}
	if _, ok := dns.IsDomainName(d); !ok {
		return nil, fmt.Errorf("ingress DNS: %q is not a domain name", cfg.Domain)
	}
	s := &DNS{domain: d, log: cfg.Log}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, a := range cfg.Addrs {
		a = a.Unmap()
		switch {
		case !a.IsValid() || a.IsUnspecified():
			return nil, fmt.Errorf("ingress DNS: %v is not an address names can resolve to", a)
		case a.Is4():
			s.v4 = append(s.v4, a)
		default:
			s.v6 = append(s.v6, a.WithZone(""))
		}
	}
	if len(s.v4)+len(s.v6) == 0 {
		return nil, errors.New("ingress DNS: no address to answer with")
	}
	return s, nil
}

// Serve answers on pc (UDP) and ln (TCP; may be nil) until Close. It
// returns once both serve.
func (s *DNS) Serve(pc net.PacketConn, ln net.Listener) {
	h := dns.HandlerFunc(s.handle)
	s.srvs = append(s.srvs, &dns.Server{PacketConn: pc, Handler: h, UDPSize: dnsUDPSize})
	if ln != nil {
		idle := func() time.Duration { return dnsTCPTimeout }
		s.srvs = append(s.srvs, &dns.Server{Listener: &capListener{Listener: ln, sem: make(chan struct{}, dnsMaxTCP)}, Handler: h,
			ReadTimeout: dnsTCPTimeout, WriteTimeout: dnsTCPTimeout, IdleTimeout: idle})
	}
	for _, srv := range s.srvs {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.log.Debug("ingress DNS stopped", "err", err)
			}
		}()
		<-started
	}
}

// Close stops serving and closes the sockets.
func (s *DNS) Close() {
	for _, srv := range s.srvs {
		_ = srv.Shutdown()
	}
}

func (s *DNS) handle(w dns.ResponseWriter, q *dns.Msg) {
	if m := s.Answer(q); m != nil {
		_ = w.WriteMsg(m)
	}
}

// Answer is the reply to query q, or nil to send none (q is itself a
// reply). It is a pure function of q and the server's configuration.
func (s *DNS) Answer(q *dns.Msg) *dns.Msg {
	if q.Response {
		return nil // never answer an answer: no loops between servers
	}
	m := new(dns.Msg)
	m.Id, m.Opcode = q.Id, q.Opcode
	m.Response, m.RecursionDesired = true, q.RecursionDesired
	if q.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	if len(q.Question) != 1 || len(q.Answer) != 0 || len(q.Ns) != 0 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	qn := q.Question[0]
	m.Question = []dns.Question{qn}
	if opt := q.IsEdns0(); opt != nil {
		m.SetEdns0(dnsUDPSize, false)
		if opt.Version() != 0 {
			m.Rcode = dns.RcodeBadVers // packed into the OPT's extended rcode
			return m
		}
	}
	name := strings.ToLower(strings.TrimSuffix(qn.Name, "."))
	if qn.Qclass != dns.ClassINET || (name != s.domain && !strings.HasSuffix(name, "."+s.domain)) {
		m.Rcode = dns.RcodeRefused
		return m
	}
	m.Authoritative = true
	hdr := dns.RR_Header{Name: qn.Name, Class: dns.ClassINET, Ttl: dnsTTL}
	switch qn.Qtype {
	case dns.TypeA:
		for _, a := range s.v4 {
			h := hdr
			h.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: h, A: net.IP(a.AsSlice())})
		}
	case dns.TypeAAAA:
		for _, a := range s.v6 {
			h := hdr
			h.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: h, AAAA: net.IP(a.AsSlice())})
		}
	}
	if len(m.Answer) == 0 {
		// The name exists, not with that type (NODATA): the SOA says for
		// how long a resolver may remember that.
		m.Ns = []dns.RR{s.soa()}
	}
	return m
}

// soa is the domain's start of authority, for negative answers.
func (s *DNS) soa() dns.RR {
	zone := dns.Fqdn(s.domain)
	return &dns.SOA{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: dnsTTL},
		Ns: zone, Mbox: "hostmaster." + zone, Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: dnsTTL}
}

// capListener closes connections past its cap at once.
type capListener struct {
	net.Listener
	sem chan struct{}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &capConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			c.Close()
		}
	}
}

type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
