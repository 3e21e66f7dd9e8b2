// Package ingress is clade's HTTP ingress: a reverse proxy that serves
// `Host: PORT-REF.DOMAIN` (REF a sandbox id or name) from that port inside
// the sandbox. It reaches the port with the service's Dial, waking (on
// this node sandbox.Traffic.DialWaking: over the sandbox's veth, else
// through its agent connection to its loopback), so
// it works whatever the sandbox's network, and a request to a sleeping
// sandbox wakes it and is served. Plain requests take the forwarder
// (forward.go), upgrades httputil.ReverseProxy.
//
// Every request must carry the sandbox's traffic token in the header
// X-Clade-Traffic-Token, or a signed URL's signature (signed.go), unless the
// sandbox was created public; neither is passed on to the sandbox. Answers of the proxy's own (the sandbox's
// answers pass unchanged): 502 with E2B's JSON body for a sandbox that does
// not exist (e2b.go), 404 for a host that is not a sandbox route, 403 for a missing or wrong token (X-Clade-Traffic-Token or E2B's E2B-Traffic-Access-Token), 409 for a sandbox that
// stopped, 503 with Retry-After when waking the sandbox was refused for
// memory (it stays asleep and intact; a retry once memory is free serves),
// 502 when nothing listens on the port or the answer is broken, 400 for a
// request body that cannot be read, 405 for CONNECT, and at the limits of
// Config: 504 for no answer head in time, 408 for a request body that
// stalls, 503 with Retry-After for one connection too many to a sandbox.
//
// Over TLS (the daemon's --ingress-tls; localca.go) HTTP/2 requests take
// the reverse proxy, HTTP/1.1 ones the forwarder. A sandbox's host mask
// (E2B's maskRequestHost) replaces the Host it is sent.
//
// Client connections are capped in all and per address before any
// request is read (Limit: one over a cap is closed at accept), and one
// that carried no request the proxy routed to a sandbox is closed after
// a few seconds idle: a client without a token cannot hold the daemon's
// descriptors.
package ingress

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/clade-sandbox/clade/internal/connlimit"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostmask"
	"github.com/clade-sandbox/clade/internal/service"
)

// TokenHeader carries a sandbox's traffic token.
const TokenHeader = "X-Clade-Traffic-Token"

// E2BTokenHeader is E2B's name for the traffic token, which the ingress
// takes beside clade's own.
const E2BTokenHeader = "E2B-Traffic-Access-Token"

// RetryAfter is what a 503 (wake refused for memory) asks clients to wait.
const RetryAfter = 2 * time.Second

// Config configures the proxy. Zero durations and counts take the
// defaults; a negative one turns that limit off.
type Config struct {
	// Domain is the suffix of every sandbox route, e.g. clade.localhost.
	Domain string
	Log    *slog.Logger
	// ResponseHeaderTimeout bounds the wait for the head of a sandbox's
	// answer once the request (with its body) is sent: past it the client
	// gets a 504. Only the head: a body that keeps coming (a download,
	// server-sent events) is never cut. Long polls that answer later than
	// this need it raised. Default DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout time.Duration
	// BodyIdleTimeout bounds the wait for the next bytes of a client's
	// request body (an upload that stalls): past it the client gets a 408
	// (or, with the answer begun, a cut one). Default
	// DefaultBodyIdleTimeout.
	BodyIdleTimeout time.Duration
	// MaxConnsPerSandbox bounds the connections the proxy holds open to
	// one sandbox's ports at once (requests in flight, kept-alive ones
	// between requests, WebSockets): one more is a 503 with Retry-After.
	// Default DefaultMaxConnsPerSandbox.
	MaxConnsPerSandbox int
	// SendTimeout bounds how long a client may take none of the bytes
	// sent to it (a full window it does not read: TCP_USER_TIMEOUT on its
	// connection): past it the connection is dropped, as nginx's
	// send_timeout does. Without it a client that stops reading holds
	// its request, and the sandbox awake, for ever. Default
	// DefaultSendTimeout.
	SendTimeout time.Duration
	// MaxClientConns bounds the client connections the ingress holds open
	// at once, from everyone, authenticated or not; MaxClientConnsPerIP
	// those from one address (an IPv6 one by its /64). A connection over
	// either is closed as it is accepted (see Limit). Defaults
	// DefaultMaxClientConns() and DefaultMaxClientConnsPerIP().
	MaxClientConns      int
	MaxClientConnsPerIP int
}

// The limits' defaults (see Config).
const (
	DefaultResponseHeaderTimeout = 5 * time.Minute
	DefaultBodyIdleTimeout       = 60 * time.Second
	DefaultMaxConnsPerSandbox    = 2048
	DefaultSendTimeout           = 60 * time.Second
)

// DefaultMaxClientConns is the default cap of the ingress's client
// connections: a quarter of the daemon's file limit, at most 4096. Each
// may hold a sandbox connection too, so the ingress takes at most half the
// daemon's descriptors, and the API's listeners, the sandboxes and the
// store keep the rest whatever clients open.
func DefaultMaxClientConns() int { return connlimit.Share(connlimit.FDLimit(), 4, 4096) }

// DefaultMaxClientConnsPerIP is the default cap of the ingress's client
// connections from one address: 256, or DefaultMaxClientConns if less.
func DefaultMaxClientConnsPerIP() int { return min(256, DefaultMaxClientConns()) }

// unroutedIdleTimeout closes a client connection idle this long that has
// carried no request the proxy routed to a sandbox (every request on it
// was refused: a host that is no sandbox's, a wrong token): such a client
// gets its answers, not a place kept for it for the server's IdleTimeout.
// A connection still sending its first request is bounded by the server's
// ReadHeaderTimeout.
const unroutedIdleTimeout = 5 * time.Second

// Proxy is the ingress's http.Handler.
type Proxy struct {
	svc    service.Service
	domain string
	log    *slog.Logger
	rp     *httputil.ReverseProxy
	tr     *http.Transport

	mu     sync.Mutex
	access map[string]access // by ref: see lookup

	conns  sync.Map                                                         // net.Conn -> *clientConn (forward.go)
	dialer func(ctx context.Context, id string, port int) (net.Conn, error) // tests: instead of the service's Dial

	headTimeout time.Duration // <= 0: none (see Config)
	bodyIdle    time.Duration // <= 0: none
	maxConns    int           // <= 0: none
	sendTimeout time.Duration // <= 0: none
	clientMax   int           // <= 0: none
	clientPerIP int           // <= 0: none
	refusedLog  atomic.Int64  // when the last refusal at accept was logged (unix ns)

	omu  sync.Mutex
	open map[string]int // guarded by omu: sandbox connections open, by sandbox id
}

// orDefault is Config's rule for a limit: zero takes def, a negative
// value turns the limit off (-1).
func orDefault[T time.Duration | int](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return -1
	}
	return v
}

// New returns the proxy for the sandboxes of svc.
func New(cfg Config, svc service.Service) *Proxy {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{svc: svc, domain: strings.ToLower(strings.Trim(cfg.Domain, ".")), log: cfg.Log, access: map[string]access{},
		headTimeout: orDefault(cfg.ResponseHeaderTimeout, DefaultResponseHeaderTimeout),
		bodyIdle:    orDefault(cfg.BodyIdleTimeout, DefaultBodyIdleTimeout),
		maxConns:    orDefault(cfg.MaxConnsPerSandbox, DefaultMaxConnsPerSandbox),
		sendTimeout: orDefault(cfg.SendTimeout, DefaultSendTimeout),
		clientMax:   orDefault(cfg.MaxClientConns, DefaultMaxClientConns()),
		clientPerIP: orDefault(cfg.MaxClientConnsPerIP, DefaultMaxClientConnsPerIP()),
		open:        map[string]int{}}
	p.tr = &http.Transport{
		// The address is "ID:PORT" (see rewrite), one pool per sandbox port.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(port)
			if err != nil {
				return nil, err
			}
			c, release, err := p.dialCounted(ctx, id, n)
			if err != nil {
				return nil, err
			}
			cc := &countedConn{Conn: c, release: release}
			cc.lim.r = c
			cc.lim.start() // the answer's head is bounded as the forwarder's
			return cc, nil
		},
		// Only upgrades come this way (the forwarder takes the rest): no
		// connection is kept for another request. A kept one would be keyed
		// by id and port, the same across a sleep and a wake, and one left
		// from before a sleep can swallow a request whole (see forward.go).
		DisableKeepAlives:  true,
		DisableCompression: true,
		// The forwarder's bounds (see readResponse and Config).
		MaxResponseHeaderBytes: maxResponseHead,
		ResponseHeaderTimeout:  max(p.headTimeout, 0),
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     checkedTransport{p.tr},
		FlushInterval: -1, // stream: every write reaches the client at once
		// Bodies are copied in large pieces: a GiB takes 4096 reads and
		// writes rather than 32768 with http's 32 KiB buffers.
		BufferPool:   bufferPool{},
		ErrorHandler: p.proxyError,
		ErrorLog:     slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
	}
	return p
}

// Close drops the proxy's idle connections to sandboxes.
func (p *Proxy) Close() { p.tr.CloseIdleConnections() }

type routeKey struct{}

// bodyKey keys an upgrade request's *clientBody in its context.
type bodyKey struct{}

type route struct {
	id   string
	port int
	// host, when set, is the Host the sandbox sees (its host mask).
	host string
}

// ParseHost splits a request host "PORT-REF.DOMAIN[:N]" into the port and
// the sandbox reference. ok is false when host is not a sandbox route of
// domain.
func ParseHost(host, domain string) (port int, ref string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, found := strings.CutSuffix(host, "."+strings.ToLower(domain))
	if !found || domain == "" {
		return 0, "", false
	}
	ps, ref, found := strings.Cut(label, "-")
	if !found || ref == "" || ps == "" || len(ps) > 5 {
		return 0, "", false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || ps[0] == '0' {
		return 0, "", false
	}
	return port, ref, true
}

// ServeHTTP routes a request to its sandbox's port.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	port, ref, ok := ParseHost(r.Host, p.domain)
	if !ok {
		p.fail(w, http.StatusNotFound, fmt.Sprintf("%q is not a sandbox address: use Host: PORT-ID.%s (ID a sandbox id or name)", r.Host, p.domain))
		return
	}
	a, err := p.lookup(r.Context(), ref)
	if err != nil {
		p.failErr(w, err, ref)
		return
	}
	if !a.public && !p.authorized(w, r, a.token, a.id, ref, port) {
		return
	}
	routed(r)
	// Busy from here until the answer is done (an upgraded connection
	// until it closes): no idle sleep under a request.
	release := p.svc.Hold(a.id)
	defer release()
	// Wake it now, so that a refused wake is told apart from a refused
	// port; for a running sandbox this is a map lookup.
	life, err := p.svc.Ready(r.Context(), a.id, service.Wake)
	if err != nil {
		p.failErr(w, err, ref)
		return
	}
	rt := route{id: a.id, port: port, host: a.hostFor(port)}
	r = r.WithContext(context.WithValue(r.Context(), routeKey{}, rt))
	if r.ProtoMajor != 1 || upgrading(r) {
		p.upgrade(w, r)
		return
	}
	p.forward(w, r, rt, life)
}

// upgrade serves r by the reverse proxy. A body is read under the body
// idle timeout, as the forwarder's: the transport starts its
// response-header timer only once the body is sent, so a body that stalls
// would hold the request for ever.
func (p *Proxy) upgrade(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 && p.bodyIdle > 0 {
		cb := &clientBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: p.bodyIdle}
		// For proxyError, which gets the outbound request, whose body
		// ReverseProxy wraps.
		r = r.WithContext(context.WithValue(r.Context(), bodyKey{}, cb))
		r.Body = cb
	}
	p.rp.ServeHTTP(w, r)
}

// upgrading reports whether r asks to switch protocols (a WebSocket).
func upgrading(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade")
}

// access is what a request to a sandbox needs of its record: none of it
// changes in the sandbox's life.
type access struct {
	id, token string
	public    bool
	hostMask  string
}

// hostFor is the Host a request to port is given for the sandbox: its
// mask with the port in, or "" (the client's Host).
func (a access) hostFor(port int) string {
	if a.hostMask == "" {
		return ""
	}
	return hostmask.Apply(a.hostMask, port)
}

// maxAccess bounds the access cache (only sandboxes that exist get in:
// a client's made-up names do not).
const maxAccess = 4096

// lookup returns ref's access. A running sandbox's comes from the cache,
// with no database read on a request's path: while its id runs, ref (its
// id, or its name, which no other sandbox can take while it exists)
// still names it. Anything else is read from the store.
func (p *Proxy) lookup(ctx context.Context, ref string) (access, error) {
	p.mu.Lock()
	a, ok := p.access[ref]
	p.mu.Unlock()
	if ok && p.svc.Running(a.id) {
		return a, nil
	}
	rec, err := p.svc.Get(ctx, ref)
	if err != nil {
		return access{}, err
	}
	a = access{id: rec.ID, public: rec.Public}
	if rec.Ingress != nil {
		a.token, a.hostMask = rec.Ingress.TrafficToken, rec.Ingress.HostMask
	}
	p.mu.Lock()
	if len(p.access) >= maxAccess {
		clear(p.access)
	}
	p.access[ref] = a
	p.mu.Unlock()
	return a, nil
}

// authorized checks a request to a private sandbox's port: its traffic
// token header, or a signed URL (query or cookie). On refusal it answers
// 403 and returns false. A signature from the query sets the cookie.
func (p *Proxy) authorized(w http.ResponseWriter, r *http.Request, token, id, ref string, port int) bool {
	tok := r.Header.Get(TokenHeader)
	if tok == "" {
		tok = r.Header.Get(E2BTokenHeader)
	}
	if token == "" {
		p.fail(w, http.StatusForbidden, fmt.Sprintf("sandbox %s has no traffic token (it was made before the ingress existed): recreate it, or create it --public", ref))
		return false
	}
	if tok != "" {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(token)) != 1 {
			p.fail(w, http.StatusForbidden, fmt.Sprintf("wrong traffic token for sandbox %s (header %s; see `clade inspect %s`)", ref, TokenHeader, ref))
			return false
		}
		return true
	}
	now := time.Now()
	v, exp, from := checkSigned(r, token, id, port, now)
	switch v {
	case signedOK:
		if from == "query" {
			http.SetCookie(w, &http.Cookie{Name: CookieName, Value: strconv.FormatInt(exp, 10) + "." + Sign(token, id, port, exp),
				Path: "/", MaxAge: int(exp - now.Unix()), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
		}
		return true
	case signedExpired:
		p.fail(w, http.StatusForbidden, fmt.Sprintf("this signed URL of sandbox %s expired at %s: ask for a new one (`clade url %s %d`)", ref, time.Unix(exp, 0).UTC().Format(time.RFC3339), ref, port))
	case signedBad:
		p.fail(w, http.StatusForbidden, fmt.Sprintf("bad signature for sandbox %s port %d (a signed URL is for one sandbox and port; ask for one with `clade url %s %d`)", ref, port, ref, port))
	default:
		p.fail(w, http.StatusForbidden, fmt.Sprintf("sandbox %s needs its traffic token: send header %s (see `clade inspect %s`), use a signed URL (`clade url %s %d`), or create the sandbox --public", ref, TokenHeader, ref, ref, port))
	}
	return false
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(route)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort(rt.id, strconv.Itoa(rt.port))
	pr.Out.Host = pr.In.Host // the application sees the name it was asked by
	if rt.host != "" {
		pr.Out.Host = rt.host
	}
	pr.Out.Header.Del(TokenHeader)
	pr.Out.Header.Del(E2BTokenHeader)
	stripSigned(pr.Out.URL)
	stripCookie(pr.Out.Header)
	stripReferer(pr.Out.Header)
	pr.SetXForwarded()
}

func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if cb, ok := r.Context().Value(bodyKey{}).(*clientBody); ok && cb.stalled() {
		// The server cancelled the request as the read of the client
		// connection timed out; the client is there to be told.
		p.fail(w, http.StatusRequestTimeout, stalledMessage(p.bodyIdle))
		return
	}
	if r.Context().Err() != nil {
		return // the client went away; nobody to tell
	}
	rt, _ := r.Context().Value(routeKey{}).(route)
	p.log.Debug("ingress: proxying failed", "sandbox", rt.id, "port", rt.port, "err", err)
	switch {
	case errdefs.ClassOf(err) == errdefs.ResourceExhausted:
		p.failErr(w, err, rt.id)
	case errors.Is(err, errHeadTimeout):
		p.fail(w, http.StatusGatewayTimeout, fmt.Sprintf("port %d of sandbox %s sent no answer within %s (the daemon's --ingress-response-timeout)", rt.port, rt.id, p.headTimeout))
	default:
		p.fail(w, http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s did not answer: %v", rt.port, rt.id, err))
	}
}

// dialCounted is dial under the proxy's cap of connections to one
// sandbox: release (idempotent) gives the connection's place back once it
// is closed. One over the cap is a ResourceExhausted error (a 503).
func (p *Proxy) dialCounted(ctx context.Context, id string, port int) (net.Conn, func(), error) {
	p.omu.Lock()
	if p.maxConns > 0 && p.open[id] >= p.maxConns {
		p.omu.Unlock()
		return nil, nil, errdefs.New(errdefs.ResourceExhausted, "sandbox %s has %d connections open through the ingress, the most the daemon allows (--ingress-max-conns): retry once some close", id, p.maxConns)
	}
	p.open[id]++
	p.omu.Unlock()
	var once sync.Once
	release := func() {
		once.Do(func() {
			p.omu.Lock()
			if p.open[id]--; p.open[id] <= 0 {
				delete(p.open, id)
			}
			p.omu.Unlock()
		})
	}
	c, err := p.dial(ctx, id, port)
	if err != nil {
		release()
		return nil, nil, err
	}
	return c, release, nil
}

// OpenConns returns the number of sandbox connections the proxy holds
// open to sandbox id.
func (p *Proxy) OpenConns(id string) int {
	p.omu.Lock()
	defer p.omu.Unlock()
	return p.open[id]
}

// countedConn is a sandbox connection of the upgrade way, whose place
// under the cap is given back at its close.
type countedConn struct {
	net.Conn
	release func()
	lim     headLimit
}

func (c *countedConn) Read(b []byte) (int, error) { return c.lim.Read(b) }

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// checkedTransport is the upgrade way's transport: an answer whose status
// is not one (Go's parser takes "099"; ReverseProxy's WriteHeader panics
// on it) is a broken answer, a 502.
type checkedTransport struct{ *http.Transport }

func (t checkedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.Transport.RoundTrip(r)
	if err != nil {
		// The transport's ResponseHeaderTimeout says so in words only
		// (a dial's timeout is a net.Error too, and no answer's).
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && strings.Contains(err.Error(), "awaiting response headers") {
			return nil, errors.Join(errHeadTimeout, err)
		}
		return nil, err
	}
	if resp.StatusCode < 100 || resp.StatusCode > 999 {
		resp.Body.Close()
		return nil, fmt.Errorf("malformed status code %q", resp.Status)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// ReverseProxy refuses a switch to another protocol than asked
		// with a 502 but leaves the sandbox connection open: one
		// descriptor (and place under the cap) per such answer.
		want, got := r.Header.Get("Upgrade"), resp.Header.Get("Upgrade")
		if got == "" || !strings.EqualFold(want, got) || !httpguts.HeaderValuesContainsToken(resp.Header["Connection"], "upgrade") {
			resp.Body.Close()
			return nil, fmt.Errorf("the server switched to protocol %q when %q was asked", got, want)
		}
	}
	return resp, nil
}

// failErr answers a classed error of the service about sandbox ref.
func (p *Proxy) failErr(w http.ResponseWriter, err error, ref string) {
	switch errdefs.ClassOf(err) {
	case errdefs.NotFound:
		p.log.Debug("ingress: no such sandbox", "sandbox", ref, "err", err)
		notFound(w, ref)
	case errdefs.Unavailable, errdefs.ResourceExhausted:
		// Above all a wake refused for memory: the sandbox sleeps on,
		// intact, and a retry once memory is free serves.
		w.Header().Set("Retry-After", strconv.Itoa(int(RetryAfter/time.Second)))
		p.fail(w, http.StatusServiceUnavailable, err.Error())
	case errdefs.Conflict:
		p.fail(w, http.StatusConflict, err.Error())
	default:
		p.fail(w, http.StatusBadGateway, err.Error())
	}
}

func (p *Proxy) fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintf(w, "clade ingress: %s\n", msg)
}

// stripCookie removes the signed URL's cookie from a request's Cookie
// headers, keeping the application's own cookies.
func stripCookie(h http.Header) {
	cs := h.Values("Cookie")
	if len(cs) == 0 {
		return
	}
	h.Del("Cookie")
	for _, line := range cs {
		var keep []string
		for _, part := range strings.Split(line, ";") {
			if name, _, _ := strings.Cut(strings.TrimSpace(part), "="); name == CookieName {
				continue
			}
			if p := strings.TrimSpace(part); p != "" {
				keep = append(keep, p)
			}
		}
		if len(keep) > 0 {
			h.Add("Cookie", strings.Join(keep, "; "))
		}
	}
}

// bufferPool lends the proxy's body copies copyBufSize buffers.
type bufferPool struct{}

const copyBufSize = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

func (bufferPool) Get() []byte { return *copyBufs.Get().(*[]byte) }

func (bufferPool) Put(b []byte) {
	if cap(b) == copyBufSize {
		b = b[:copyBufSize]
		copyBufs.Put(&b)
	}
}
