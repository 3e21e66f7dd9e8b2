package sdk

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/clade-sandbox/clade/api"
)

// Ingress is how a sandbox's ports are reached through the daemon's
// ingress proxy.
type Ingress = api.Ingress

// ListSandboxesLabeled returns the sandboxes that have every label of
// labels (all of them when labels is empty).
func (c *Client) ListSandboxesLabeled(ctx context.Context, labels map[string]string) ([]Sandbox, error) {
	q := url.Values{}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var sbs []Sandbox
	return sbs, c.call(ctx, http.MethodGet, path, nil, &sbs)
}

// SetTimeout renews a sandbox's timeout: it now ends d from now (0 removes
// it). onTimeout, "rm", "sleep" or "sleep-files", replaces what happens then; empty keeps
// it.
func (c *Client) SetTimeout(ctx context.Context, ref string, d time.Duration, onTimeout string) (Sandbox, error) {
	if d < 0 || d%time.Millisecond != 0 {
		return Sandbox{}, &Error{Code: "invalid_argument", Message: fmt.Sprintf("timeout %s: give 0 or a positive whole number of milliseconds", d)}
	}
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/timeout",
		api.TimeoutRequest{TimeoutMS: d.Milliseconds(), OnTimeout: onTimeout}, &sb)
}

// DialPort opens a TCP connection to port on the loopback of sandbox ref,
// through the daemon (a sleeping sandbox is woken first). The connection
// supports CloseWrite (half-close). Nothing listening on the port is an
// error for which IsUnavailable is true.
func (c *Client) DialPort(ctx context.Context, ref string, port int) (net.Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/ports/"+strconv.Itoa(port), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.TCPUpgradeProtocol)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, ctxErr(ctx, err)
	}
	br := bufio.NewReaderSize(conn, 32<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, ctxErr(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("daemon did not upgrade the port connection: %s", resp.Status)
	}
	if !stop() {
		conn.Close()
		return nil, ctx.Err()
	}
	return &portConn{Conn: conn, br: br}, nil
}

// portConn reads through the buffer that read the 101 answer.
type portConn struct {
	net.Conn
	br *bufio.Reader
}

func (p *portConn) Read(b []byte) (int, error) { return p.br.Read(b) }

// CloseWrite half-closes the connection: the sandbox's side reads EOF.
func (p *portConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("half-close is not supported on this connection")
}

// SignedURL returns a URL of port inside sandbox ref through the daemon's
// ingress that needs no traffic token for ttl (0: one hour; at most 30
// days): for a browser, or anything that cannot send a header. The daemon
// must serve an ingress (Conflict otherwise).
func (c *Client) SignedURL(ctx context.Context, ref string, port int, ttl time.Duration) (api.SignedURL, error) {
	// The API counts whole milliseconds, 0 its default: a positive ttl under
	// a millisecond would be signed for an hour.
	if ttl < 0 || (ttl > 0 && ttl < time.Millisecond) {
		return api.SignedURL{}, &Error{Code: "invalid_argument", Message: fmt.Sprintf("ttl %s: give 1ms or more (0: one hour)", ttl)}
	}
	var u api.SignedURL
	return u, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/ports/"+strconv.Itoa(port)+"/url",
		api.SignedURLRequest{TTLMS: ttl.Milliseconds()}, &u)
}

// IngressCA returns the PEM certificate of the CA that signed the
// daemon's ingress certificate (`clade daemon --ingress-tls` without a
// certificate of its own): trust it to reach sandboxes over https. A
// daemon without one answers an error for which IsNotFound is true.
func (c *Client) IngressCA(ctx context.Context) ([]byte, error) {
	var ca api.IngressCA
	if err := c.call(ctx, http.MethodGet, "/v1/ingress/ca", nil, &ca); err != nil {
		return nil, err
	}
	return []byte(ca.PEM), nil
}
