package ingress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/connlimit"
	"github.com/clade-sandbox/clade/internal/service"
)

// The forwarder is the proxy's way for plain HTTP/1.x requests (upgrades
// go through httputil.ReverseProxy). It exists for speed, measured in
// docs/benchmarks.md (issue 9): a request and its answer are written and
// read by the client connection's own goroutine over a sandbox connection
// kept for that client connection, with no hand-off to a transport's
// reader and writer goroutines, and a body of known length goes from the
// sandbox's socket to the client's with splice(2) when both are TCP (a
// server on the sandbox's own address), never through user space.
//
// Each client connection keeps at most one sandbox connection (HTTP/1.1
// serves one request at a time on a connection), made for one sandbox,
// port and life of the sandbox: a request for another, or after the
// sandbox slept and woke, dials afresh. A sandbox connection is closed with
// its client connection.
//
// The life matters: a connection over the veth made before a sleep may
// never hear that its sandbox is gone (the netns and veth went with the
// sleep; the reset gVisor sends at its checkpoint does not always arrive),
// so a request written on it after the wake waits for an answer that
// never comes. The reverse proxy's transport, which kept idle connections
// by id and port, hung 6 of 90 requests that way in
// TestIngressRequestsRacingWakes (the hang seen once under load).

// connKey keys a client connection's *clientConn in its context.
type connKey struct{}

// clientConn is what the proxy keeps for one client connection.
type clientConn struct {
	mu     sync.Mutex
	be     *backend    // guarded by mu: idle between requests
	closed bool        // guarded by mu: the client connection is gone
	idle   *time.Timer // guarded by mu: closes the connection idle unrouted (see unroutedIdleTimeout)
	routed atomic.Bool // a request on it was routed to a sandbox
}

// backend is a connection to a port inside a sandbox.
type backend struct {
	id      string
	port    int
	life    any // the sandbox's guest connection when it was dialled: a wake makes another
	c       net.Conn
	release func()     // gives the connection's place under the proxy's cap back
	lim     *headLimit // under br: bounds an answer's head
	br      *bufio.Reader
	bw      *bufio.Writer

	// The response-header timer (see armHead).
	hmu      sync.Mutex
	waiting  bool        // guarded by hmu: an answer's head is awaited
	timer    *time.Timer // guarded by hmu: the timer of a connection with no deadlines
	timedOut atomic.Bool // the timer fired
}

func (b *backend) close() {
	b.c.Close()
	b.release()
}

// cut makes whatever blocks on b's connection return now: its deadline
// passes, or, on a connection that has none (one through the agent), it
// is closed.
func (b *backend) cut() {
	if b.c.SetDeadline(time.Unix(1, 0)) != nil {
		b.c.Close()
	}
}

// awaitHead marks the start of a request's exchange: its answer's head is
// awaited from here until headDone.
func (b *backend) awaitHead() {
	b.hmu.Lock()
	b.waiting = true
	b.hmu.Unlock()
}

// armHead starts the response-header timer (d > 0) once the request is
// sent whole, unless its answer's head came already (a server may answer
// before it has read the body, and that answer's body must not be cut).
// A client gone meanwhile (whose cut the new deadline may have undone)
// cuts again.
func (b *backend) armHead(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	b.hmu.Lock()
	if !b.waiting {
		b.hmu.Unlock()
		return
	}
	if b.c.SetReadDeadline(time.Now().Add(d)) != nil {
		b.timer = time.AfterFunc(d, func() {
			b.timedOut.Store(true)
			b.c.Close()
		})
	}
	b.hmu.Unlock()
	if ctx.Err() != nil {
		b.cut()
	}
}

// headDone stops the response-header timer: the final answer's head came.
// A client gone meanwhile (whose cut this may have undone) cuts again.
func (b *backend) headDone(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	b.hmu.Lock()
	b.waiting = false
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	} else {
		b.c.SetReadDeadline(time.Time{})
	}
	b.hmu.Unlock()
	if ctx.Err() != nil {
		b.cut()
	}
}

// headTimedOut reports whether err ended the wait for an answer's head at
// the response-header timeout (not at a client's going away).
func (b *backend) headTimedOut(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (b.timedOut.Load() || errors.Is(err, os.ErrDeadlineExceeded))
}

// A backend's buffers go back to these while it is idle (nothing is in
// them then), and it takes others for its next request: a client
// connection idle between requests keeps its sandbox connection, not 80
// KiB of buffers for it.
var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}
)

// bufs gives b buffers for a request.
func (b *backend) bufs() {
	b.br = readers.Get().(*bufio.Reader)
	b.br.Reset(b.lim)
	b.bw = writers.Get().(*bufio.Writer)
	b.bw.Reset(b.c)
}

// idle returns b's buffers, which must be empty and no longer used.
func (b *backend) idle() {
	b.br.Reset(nil)
	readers.Put(b.br)
	b.bw.Reset(nil)
	writers.Put(b.bw)
	b.br, b.bw = nil, nil
}

// take returns cc's idle sandbox connection if it is for id, port and
// life and still open; else nil (closing one that is not).
func (cc *clientConn) take(id string, port int, life any) *backend {
	if cc == nil {
		return nil
	}
	cc.mu.Lock()
	be := cc.be
	cc.be = nil
	cc.mu.Unlock()
	if be == nil {
		return nil
	}
	if be.id != id || be.port != port || be.life != life || !idleOpen(be) {
		be.close()
		return nil
	}
	be.bufs()
	return be
}

// put keeps be for the client connection's next request.
func (cc *clientConn) put(be *backend) {
	if cc == nil {
		be.close()
		return
	}
	cc.mu.Lock()
	if cc.closed || cc.be != nil {
		cc.mu.Unlock()
		be.close()
		return
	}
	cc.be = be
	cc.mu.Unlock()
}

// shut closes cc's sandbox connection: its client connection is gone.
func (cc *clientConn) shut() {
	cc.mu.Lock()
	be := cc.be
	cc.be = nil
	cc.closed = true
	if cc.idle != nil {
		cc.idle.Stop()
	}
	cc.mu.Unlock()
	if be != nil {
		be.close()
	}
}

// idleOpen reports whether an idle sandbox connection can carry a request:
// nothing arrived on it since its last answer (a server that closed it sent
// EOF; one that sent bytes unasked is not speaking HTTP). One non-blocking
// peek for a socket; a connection through the agent, which says when it
// closes, is trusted.
func idleOpen(be *backend) bool {
	sc, ok := be.c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = n < 0 && errors.Is(err, unix.EAGAIN)
		return true
	})
	return err == nil && open
}

// ConnContext is the ingress server's http.Server.ConnContext: it gives
// each client connection its place for a sandbox connection.
func (p *Proxy) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if p.sendTimeout > 0 {
		setUserTimeout(c, p.sendTimeout)
	}
	cc := &clientConn{}
	p.conns.Store(c, cc)
	return context.WithValue(ctx, connKey{}, cc)
}

// setUserTimeout sets TCP_USER_TIMEOUT on a client's TCP connection: the
// kernel drops it once bytes sent stay unacknowledged for d, zero-window
// probes included (Linux 5.1 on), i.e. a client that stops reading.
// One call per connection, none per request. The option is a 32-bit count
// of milliseconds whose 0 means none: d is held to 1 ms .. ~24.8 days, so
// a sub-millisecond or very long --ingress-send-timeout never turns the
// limit off (an overflowed value was refused, silently).
func setUserTimeout(c net.Conn, d time.Duration) {
	tc, ok := connlimit.Unwrap(c).(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(min(max(d/time.Millisecond, 1), math.MaxInt32)))
	})
}

// ConnState is the ingress server's http.Server.ConnState: a client
// connection that closes (or is taken over) closes its sandbox connection,
// and one that goes idle with no request routed on it yet is closed after
// unroutedIdleTimeout unless a request comes.
func (p *Proxy) ConnState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateIdle:
		if v, ok := p.conns.Load(c); ok {
			v.(*clientConn).idling(c)
		}
	case http.StateActive:
		if v, ok := p.conns.Load(c); ok {
			v.(*clientConn).active()
		}
	case http.StateClosed, http.StateHijacked:
		if v, ok := p.conns.LoadAndDelete(c); ok {
			v.(*clientConn).shut()
		}
	}
}

// idling starts the unrouted idle timer of cc, whose connection is c.
func (cc *clientConn) idling(c net.Conn) {
	if cc.routed.Load() {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	switch {
	case cc.closed:
	case cc.idle == nil:
		cc.idle = time.AfterFunc(unroutedIdleTimeout, func() { c.Close() })
	default:
		cc.idle.Reset(unroutedIdleTimeout)
	}
}

// active stops the unrouted idle timer: a request came.
func (cc *clientConn) active() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.idle != nil {
		cc.idle.Stop()
	}
}

// routed marks r's client connection as one that carried a request to a
// sandbox: it is kept idle for the server's IdleTimeout from then on.
func routed(r *http.Request) {
	if cc, ok := r.Context().Value(connKey{}).(*clientConn); ok {
		cc.routed.Store(true)
	}
}

// Server returns an http.Server that serves the proxy with its connection
// hooks (without them every request dials the sandbox afresh).
func (p *Proxy) Server() *http.Server {
	return &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout,
		ConnContext: p.ConnContext, ConnState: p.ConnState, ErrorLog: p.rp.ErrorLog}
}

// idleTimeout closes a client connection (and the sandbox connection it
// keeps) idle this long, as the reverse proxy's transport closed its idle
// sandbox connections.
const idleTimeout = 90 * time.Second

// hopHeaders are the hop-by-hop headers (RFC 9110 7.6.1), which a proxy
// does not pass on, and Expect, which the front server answers itself.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect"}

func removeHop(h http.Header) {
	for _, f := range h["Connection"] {
		for _, name := range strings.Split(f, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// outRequest is r as the sandbox gets it (see rewrite, the upgrade way's
// equivalent).
func outRequest(w http.ResponseWriter, r *http.Request, bodyIdle time.Duration) *http.Request {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Close = false
	u := *r.URL
	stripSigned(&u)
	out.URL = &u
	te := r.Header.Get("Te")
	removeHop(out.Header)
	if strings.Contains(strings.ToLower(te), "trailers") {
		out.Header.Set("Te", "trailers")
	}
	out.Header.Del(TokenHeader)
	out.Header.Del(E2BTokenHeader)
	stripCookie(out.Header)
	stripReferer(out.Header)
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		out.Header.Del(h)
	}
	(&httputil.ProxyRequest{In: r, Out: out}).SetXForwarded()
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // not Go's own
	}
	if r.ContentLength == 0 {
		out.Body = http.NoBody
		out.Trailer = nil
	} else {
		cb := &clientBody{ReadCloser: r.Body, idle: bodyIdle}
		if bodyIdle > 0 {
			cb.rc = http.NewResponseController(w)
		}
		if len(r.Trailer) > 0 {
			// The server fills r.Trailer in as the body ends (a clone,
			// as Clone makes, would stay empty: the sandbox got declared
			// trailers that never came); cb checks them then.
			out.Trailer = r.Trailer
			cb.trailer = r.Trailer
			for k := range r.Trailer {
				if !forwardTrailer(k) {
					delete(r.Trailer, k)
				}
			}
			cb.declared = slices.Collect(maps.Keys(r.Trailer))
		}
		out.Body = cb
	}
	return out
}

// forwardTrailer reports whether a client's trailer field k may reach the
// sandbox: not one a trailer must not carry (framing, routing, auth: RFC
// 9110 6.5.1), not a hop-by-hop one, not the traffic token, and none of
// the headers the proxy sets or filters (an app that merges trailers into
// its headers must not take a client's X-Forwarded-For for the proxy's).
func forwardTrailer(k string) bool {
	switch k {
	case TokenHeader, "E2b-Traffic-Access-Token", "Cookie", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return false
	}
	if !httpguts.ValidTrailerHeader(k) {
		return false
	}
	for _, h := range hopHeaders {
		if k == h {
			return false
		}
	}
	return true
}

// clientBody is a request's body from the client, keeping the error that
// ended a read of it other than its end (a malformed chunk, a client that
// went away, one that sent nothing for idle).
type clientBody struct {
	io.ReadCloser
	rc       *http.ResponseController // the client connection's: with idle > 0
	idle     time.Duration
	trailer  http.Header // the request's trailers, filled in at the body's end
	declared []string    // the trailer fields the client declared, as may pass
	err      error
	since    atomic.Int64 // with rc: when the read in progress began (unix ns), 0 between reads
	stall    atomic.Bool  // with rc: a read ended at the idle timeout
}

func (b *clientBody) Read(p []byte) (int, error) {
	if b.rc != nil {
		now := time.Now()
		b.since.Store(now.UnixNano())
		b.rc.SetReadDeadline(now.Add(b.idle))
	}
	n, err := b.ReadCloser.Read(p)
	if b.rc != nil {
		b.since.Store(0)
	}
	if err == nil {
		return n, nil
	}
	if err != io.EOF {
		if b.rc != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				b.stall.Store(true)
			}
			// The body's Close (the request's writer calls it) drains the
			// rest from the client: it must not wait for a client gone
			// quiet. The connection carries no other request.
			b.rc.SetReadDeadline(time.Unix(1, 0))
		}
		b.err = err
		return n, err
	}
	if b.rc != nil {
		// No deadline left behind: the server reads on in the background
		// for the client's close, and one passing would end the answer.
		b.rc.SetReadDeadline(time.Time{})
	}
	// Only the declared trailers pass, of the fields that may: the
	// server took whatever came.
	for k := range b.trailer {
		if !slices.Contains(b.declared, k) {
			delete(b.trailer, k)
		}
	}
	return n, err
}

func stalledMessage(idle time.Duration) string {
	return fmt.Sprintf("the request's body stalled: no bytes of it came for %s (the daemon's --ingress-body-timeout)", idle)
}

// stalled reports whether the client's body ended on the body idle
// timeout. Safe while another goroutine reads the body (the upgrade way's
// transport): the server cancels the request as the read times out,
// before that read returns, so a read begun idle ago counts too.
func (b *clientBody) stalled() bool {
	if b.rc == nil {
		return false
	}
	since := b.since.Load()
	return b.stall.Load() || since != 0 && time.Since(time.Unix(0, since)) >= b.idle
}

// errClientBody marks a request's body that could not be read whole.
var errClientBody = errors.New("the request's body could not be read")

// forward serves r from port rt of its sandbox, whose guest connection
// (its life: see backend) is life. It answers 502 itself when the sandbox
// does not answer.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, rt route, life any) {
	if r.Method == http.MethodConnect {
		// Written on, it reached the sandbox as "CONNECT //host:port", and
		// a 200 to it left the client connection on a tunnel it never got.
		p.fail(w, http.StatusMethodNotAllowed, "CONNECT is not served: the ingress forwards requests to a sandbox's port, it makes no tunnels")
		return
	}
	ctx := r.Context()
	cc, _ := ctx.Value(connKey{}).(*clientConn)
	out := outRequest(w, r, p.bodyIdle)
	if rt.host != "" {
		out.Host = rt.host // the sandbox's host mask
	}
	if out.Body != http.NoBody {
		// The body is read on while the answer is written (see roundTrip):
		// without this, the server reads 256 KiB of a chunked body at the
		// answer's first write, throws it away and ends the body there.
		http.NewResponseController(w).EnableFullDuplex()
	}
	be := cc.take(rt.id, rt.port, life)
	var (
		resp  *http.Response
		wdone <-chan error // a body's writer (see roundTrip)
		err   error
	)
	for {
		reused := be != nil
		if be == nil {
			c, release, derr := p.dialCounted(ctx, rt.id, rt.port)
			if derr != nil {
				p.proxyError(w, r, derr)
				return
			}
			lim := &headLimit{r: c, n: -1}
			be = &backend{id: rt.id, port: rt.port, life: life, c: c, release: release, lim: lim}
			be.bufs()
		}
		resp, wdone, err = p.roundTrip(ctx, be, out)
		if err == nil {
			break
		}
		timedOut := be.headTimedOut(ctx, err)
		be.close()
		be = nil
		// A kept connection the sandbox closed while idle (a server's
		// keep-alive timeout) is no answer: a request with no body that is
		// safe to repeat is sent again, once, over a new one. Any other may
		// have been served before the close (a POST would charge twice).
		if cb, _ := out.Body.(*clientBody); cb != nil && cb.stalled() {
			// The server cancelled the request as the read of the client
			// connection timed out; the client is there to be told.
			p.fail(w, http.StatusRequestTimeout, stalledMessage(p.bodyIdle))
			return
		}
		if errors.Is(err, errClientBody) && ctx.Err() == nil {
			p.fail(w, http.StatusBadRequest, err.Error())
			return
		}
		if timedOut {
			p.proxyError(w, r, errHeadTimeout)
			return
		}
		if !reused || out.Body != http.NoBody || !idempotent(out) || ctx.Err() != nil || !retryable(err) {
			p.proxyError(w, r, err)
			return
		}
	}
	// Closed unless kept, whatever answer does: it panics to abort a cut
	// body (and WriteHeader may panic), and a sandbox connection left open
	// then is a descriptor the daemon never gets back.
	keep := false
	defer func() {
		if keep {
			p.maybeKeep(cc, be, resp)
		} else {
			be.close()
		}
	}()
	keep = p.answer(w, r, be, resp) && ctx.Err() == nil
	if wdone != nil {
		// The body's writer is done with the client's body before the
		// handler returns. One still writing when the answer is whole (the
		// server answered without reading it all) ends on the closed
		// connection, which carries no other request.
		select {
		case werr := <-wdone:
			keep = keep && werr == nil
		default:
			keep = false
			be.close()
			<-wdone
		}
	}
}

// maxResponseHead bounds the head of a sandbox's answer (as
// http.Transport's MaxResponseHeaderBytes does): a sandbox that sends
// header lines without end gets a 502, not the daemon's memory.
const maxResponseHead = 1 << 20

// maxResponseHeadLines bounds the lines of an answer's head (as Node's
// maxHeadersCount does): a head of 1 MiB of tiny header lines ("a:b")
// takes ~20 MiB to parse, and one sandbox may hold --ingress-max-conns
// answers in flight.
const maxResponseHeadLines = 2000

// headLimit is the reader under a backend's bufio.Reader: while n >= 0
// (an answer's head is being read) it gives at most n more bytes, and
// ends at the head's maxResponseHeadLines-th line.
type headLimit struct {
	r     io.Reader
	n     int64 // < 0: no limit
	lines int   // lines of the head so far; < 0: its end came
	line  int   // bytes of the line so far
	cr    bool  // the last byte read was '\r'
}

var (
	errHeadTooLarge = fmt.Errorf("the answer's head is over %d bytes", maxResponseHead)
	errHeadTooLong  = fmt.Errorf("the answer's head has over %d lines", maxResponseHeadLines)
	// errHeadTimeout marks an answer whose head did not come within the
	// response-header timeout.
	errHeadTimeout = errors.New("no answer within the response-header timeout")
)

// start arms l for an answer's head.
func (l *headLimit) start() {
	l.n, l.lines, l.line, l.cr = maxResponseHead, 0, 0, false
}

func (l *headLimit) Read(b []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(b)
	}
	if l.n == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	if l.lines >= 0 && !l.count(b[:n]) {
		return 0, errHeadTooLong // none of it: what came before is no whole head
	}
	if l.lines < 0 {
		l.n = -1 // past the head
	}
	return n, err
}

// count counts the head's lines in b, a line at a time (a head has a few:
// no byte loop), up to its end, an empty line (the rest is the body). It
// reports false past maxResponseHeadLines.
func (l *headLimit) count(b []byte) bool {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			l.line += len(b)
			l.cr = b[len(b)-1] == '\r'
			return true
		}
		cr := i > 0 && b[i-1] == '\r' || i == 0 && l.cr
		if l.line+i == 0 || l.line+i == 1 && cr {
			l.lines = -1
			return true
		}
		if l.lines++; l.lines > maxResponseHeadLines {
			return false
		}
		l.line, l.cr = 0, false
		b = b[i+1:]
	}
	return true
}

// readResponse reads the head of an answer to out from be, bounded, and
// refuses a status that is not one (Go's parser takes any three
// characters Atoi reads, "099" or "+99"; WriteHeader panics on them).
func readResponse(be *backend, out *http.Request) (*http.Response, error) {
	be.lim.start()
	resp, err := http.ReadResponse(be.br, out)
	be.lim.n = -1
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 100 || resp.StatusCode > 999 {
		resp.Body.Close()
		return nil, fmt.Errorf("malformed status code %q", resp.Status)
	}
	return resp, nil
}

// dial is the proxy's way to a port of a sandbox (replaced in tests).
func (p *Proxy) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if p.dialer != nil {
		return p.dialer(ctx, id, port)
	}
	return p.svc.Dial(ctx, id, service.Wake, port)
}

// retryable reports whether err says a kept connection was closed before
// it answered (http.ReadResponse says io.ErrUnexpectedEOF for a clean close).
func retryable(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// idempotent reports whether r may be sent twice (RFC 9110 9.2.2; as
// http.Transport, a request with an Idempotency-Key header too).
func idempotent(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k1 := r.Header["Idempotency-Key"]
	_, k2 := r.Header["X-Idempotency-Key"]
	return k1 || k2
}

// roundTrip writes out over be and reads the answer's head (1xx answers
// other than 101 are passed to the client as they come, see answer).
//
// A request with a body is written by a goroutine of its own while the
// answer is read: a server may answer before it has read the body (a 413,
// say), or while it reads it (an echo, full duplex), and one that does
// not read on while its answer is not read would wait for the proxy as
// the proxy waits for it. The answer's reader then gets the writer's end
// on wdone, which it must receive before the handler returns.
func (p *Proxy) roundTrip(ctx context.Context, be *backend, out *http.Request) (resp *http.Response, wdone <-chan error, err error) {
	// A client that goes away ends the exchange: the sandbox connection's
	// deadline passes, and whatever blocks on it returns.
	stop := context.AfterFunc(ctx, be.cut)
	defer stop()
	be.awaitHead()
	cb, _ := out.Body.(*clientBody)
	if cb == nil {
		if err := writeRequest(be, out); err != nil {
			return nil, nil, err
		}
		be.armHead(ctx, p.headTimeout)
		resp, err := readResponse(be, out)
		return resp, nil, err
	}
	done := make(chan error, 1)
	go func() {
		err := writeRequest(be, out)
		if cb.err != nil {
			// The sandbox has a cut body and waits for the rest, which
			// never comes: no answer of its to wait for.
			be.cut()
		} else if err == nil {
			be.armHead(ctx, p.headTimeout)
		}
		done <- err
	}()
	resp, err = readResponse(be, out)
	if err != nil {
		be.cut()
		werr := <-done
		if cb.err != nil {
			return nil, nil, errors.Join(errClientBody, cb.err)
		}
		return nil, nil, errors.Join(werr, err)
	}
	return resp, done, nil
}

func writeRequest(be *backend, out *http.Request) error {
	if err := out.Write(be.bw); err != nil {
		return err
	}
	return be.bw.Flush()
}

// answer copies resp to w (1xx answers as they come, then the final one
// with its body and trailers) and reports whether the sandbox connection
// is left at the end of a whole answer, ready for another request.
func (p *Proxy) answer(w http.ResponseWriter, r *http.Request, be *backend, resp *http.Response) bool {
	ctx := r.Context()
	stop := context.AfterFunc(ctx, be.cut)
	defer stop()
	for n := 0; resp.StatusCode >= 100 && resp.StatusCode < 200; n++ {
		if n == max1xx {
			// A sandbox sending 1xx answers without end (each a new head,
			// none over the caps) would hold the request for ever.
			p.proxyError(w, r, fmt.Errorf("the server sent over %d informational (1xx) answers", max1xx))
			return false
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// Not asked for (upgrades take the other way).
			p.proxyError(w, r, errors.New("the server switched protocols unasked"))
			return false
		}
		if r.ProtoAtLeast(1, 1) { // not to an HTTP/1.0 client (RFC 9110 15.2)
			h := w.Header()
			copyHeader(h, resp.Header)
			w.WriteHeader(resp.StatusCode)
			clear(h)
		}
		var err error
		if resp, err = readResponse(be, resp.Request); err != nil {
			// Only 1xx answers came, which commit nothing: the client
			// gets the proxy's answer (not the server's empty 200).
			if be.headTimedOut(ctx, err) {
				err = errHeadTimeout
			}
			p.proxyError(w, r, err)
			return false
		}
	}
	be.headDone(ctx, p.headTimeout)
	h := w.Header()
	removeHop(resp.Header)
	copyHeader(h, resp.Header)
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil // the answer as it came: no type sniffed by the server
	}
	if len(resp.Trailer) > 0 {
		keys := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h["Trailer"] = []string{strings.Join(keys, ", ")}
	}
	chunked := len(resp.TransferEncoding) > 0
	if resp.ContentLength >= 0 && !chunked && r.Method != http.MethodHead {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead || !bodyAllowed(resp.StatusCode) {
		return !resp.Close
	}
	if resp.ContentLength >= 0 && !chunked {
		if err := copyKnown(w, be, resp.ContentLength); err != nil {
			p.log.Debug("ingress: body copy ended", "sandbox", be.id, "port", be.port, "err", err)
			return false
		}
		return !resp.Close
	}
	// Chunked, or until the server closes: streamed, every piece flushed
	// to the client as it comes (server-sent events, long polls).
	err := copyFlushing(w, resp.Body)
	resp.Body.Close()
	if err != nil {
		p.log.Debug("ingress: body copy ended", "sandbox", be.id, "port", be.port, "err", err)
		if !errors.Is(err, errClient) {
			panic(http.ErrAbortHandler) // the client must not take a cut body for a whole one
		}
		return false
	}
	for k, vv := range resp.Trailer {
		h[k] = vv
	}
	return chunked && !resp.Close
}

// max1xx bounds the informational answers before a final one (as
// http.Transport's, which allows 5, a few more: 100 and 103s).
const max1xx = 10

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append(dst[k][:0:0], vv...)
	}
}

// errClient marks a write to the client that failed.
var errClient = errors.New("writing to the client failed")

// copyKnown copies an n-byte body from be to w: what be's reader holds
// first, then the rest straight from the socket, which the server spliced
// into the client's socket when both are TCP.
func copyKnown(w http.ResponseWriter, be *backend, n int64) error {
	if k := min(int64(be.br.Buffered()), n); k > 0 {
		buf, _ := be.br.Peek(int(k))
		if _, err := w.Write(buf); err != nil {
			return errors.Join(errClient, err)
		}
		be.br.Discard(int(k))
		n -= k
	}
	if n == 0 {
		return nil
	}
	var src io.Reader = &io.LimitedReader{R: be.c, N: n}
	if _, ok := be.c.(*net.TCPConn); !ok {
		// Not spliceable: in large pieces, not http's 32 KiB ones.
		b := bufferPool{}.Get()
		defer bufferPool{}.Put(b)
		got, err := io.CopyBuffer(writerOnly{w}, src, b)
		return short(got, n, err)
	}
	rf, ok := w.(io.ReaderFrom)
	if !ok {
		rf = readerFrom{w}
	}
	got, err := rf.ReadFrom(src)
	return short(got, n, err)
}

func short(got, want int64, err error) error {
	if err == nil && got < want {
		err = io.ErrUnexpectedEOF
	}
	return err
}

type readerFrom struct{ io.Writer }

func (r readerFrom) ReadFrom(src io.Reader) (int64, error) {
	b := bufferPool{}.Get()
	defer bufferPool{}.Put(b)
	return io.CopyBuffer(writerOnly{r.Writer}, src, b)
}

// writerOnly hides w's ReadFrom, so that io.CopyBuffer uses the buffer.
type writerOnly struct{ io.Writer }

// copyFlushing copies src to w, flushing after every read.
func copyFlushing(w http.ResponseWriter, src io.Reader) error {
	rc := http.NewResponseController(w)
	b := bufferPool{}.Get()
	defer bufferPool{}.Put(b)
	for {
		n, rerr := src.Read(b)
		if n > 0 {
			if _, err := w.Write(b[:n]); err != nil {
				return errors.Join(errClient, err)
			}
			if err := rc.Flush(); err != nil {
				return errors.Join(errClient, err)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// maybeKeep keeps be for the client connection's next request, unless
// either side said this answer ends the connection.
func (p *Proxy) maybeKeep(cc *clientConn, be *backend, resp *http.Response) {
	// Bytes after the answer: the server is not speaking HTTP.
	if resp.Close || be.br.Buffered() > 0 {
		be.close()
		return
	}
	be.c.SetDeadline(time.Time{})
	be.idle()
	cc.put(be)
}
