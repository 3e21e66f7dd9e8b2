// Package sdk is the typed Go client of the clade daemon. The CLI, the
// benchmark harness and every other clade tool talk to the daemon only
// through it.
//
//	c, err := sdk.New("")            // CLADE_HOST or the default socket
//	sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
//	res, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c", "print(1)"}, Stdout: os.Stdout})
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/deadpeer"
)

// Types of the API, re-exported for SDK users.
type (
	Sandbox              = api.Sandbox
	CreateSandboxRequest = api.CreateSandboxRequest
	Image                = api.Image
	Health               = api.Health
	EngineStatus         = api.EngineStatus
	ExitStatus           = api.ExitStatus
	Snapshot             = api.Snapshot
	ForkResult           = api.ForkResult
	ForkChild            = api.ForkChild
	Network              = api.Network
	NetworkChange        = api.NetworkChange
)

// DefaultSocket is where the daemon listens by default.
const DefaultSocket = "/run/clade/clade.sock"

// Client talks to one daemon. It is safe for concurrent use and keeps
// connections alive between calls.
type Client struct {
	base  string // http://host or http://unix
	token string
	// dial opens a raw connection to the daemon, for upgraded streams.
	dial func(ctx context.Context) (net.Conn, error)
	hc   *http.Client
	host string // as given, for messages
	// deadPeer is WithDeadPeerTimeout's (TCP only).
	deadPeer time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithToken sets the bearer token for TCP daemons.
func WithToken(tok string) Option { return func(c *Client) { c.token = tok } }

// New returns a client for host: a unix socket path ("/run/clade/clade.sock"
// or "unix:///path"), or "http://HOST:PORT" / "tcp://HOST:PORT". An empty
// host uses $CLADE_HOST, then DefaultSocket. The token defaults to
// $CLADE_TOKEN.
func New(host string, opts ...Option) (*Client, error) {
	if host == "" {
		host = os.Getenv("CLADE_HOST")
	}
	if host == "" {
		host = DefaultSocket
	}
	c := &Client{token: os.Getenv("CLADE_TOKEN"), host: host, deadPeer: DefaultDeadPeerTimeout}
	var network, addr string
	switch {
	case strings.HasPrefix(host, "unix://"):
		network, addr = "unix", strings.TrimPrefix(host, "unix://")
	case strings.HasPrefix(host, "/"), strings.HasPrefix(host, "."):
		network, addr = "unix", host
	case strings.HasPrefix(host, "http://"), strings.HasPrefix(host, "tcp://"):
		u, err := url.Parse(host)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("bad host %q: use a socket path or http://HOST:PORT", host)
		}
		network, addr = "tcp", u.Host
	default:
		return nil, fmt.Errorf("bad host %q: use a socket path, unix:///path or http://HOST:PORT", host)
	}
	c.base = "http://clade"
	if network == "tcp" {
		c.base = "http://" + addr
	}
	c.dial = func(ctx context.Context) (net.Conn, error) {
		dial := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
		if network == "tcp" {
			dial = deadpeer.NewDialer(5*time.Second, c.deadPeer).DialContext
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, &ConnectError{Host: host, Err: err}
		}
		return conn, nil
	}
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// ConnectError means the daemon could not be reached.
type ConnectError struct {
	Host string
	Err  error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("cannot reach the clade daemon at %s (is `clade daemon` running? set --host or CLADE_HOST): %v", e.Host, e.Err)
}
func (e *ConnectError) Unwrap() error { return e.Err }

// Error is an error answer of the daemon.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsNotFound reports whether err says the sandbox, image or path does not exist.
func IsNotFound(err error) bool { return hasCode(err, "not_found") }

// IsInvalidArgument reports whether err says the request was malformed.
func IsInvalidArgument(err error) bool { return hasCode(err, "invalid_argument") }

// IsConflict reports whether err says the request conflicts with the state.
func IsConflict(err error) bool { return hasCode(err, "conflict") || hasCode(err, "already_exists") }

// IsUnavailable reports whether err is retryable.
func IsUnavailable(err error) bool { return hasCode(err, "unavailable") }

// IsResourceExhausted reports whether err says a limit was reached (e.g. an
// upload with more files than the sandbox's memory allows).
func IsResourceExhausted(err error) bool { return hasCode(err, "resource_exhausted") }

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	if err := checkRefs(path); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// checkRefs refuses a path in which an escaped id or name was empty, "."
// or "..": the daemon's router cleans such a path into another endpoint's
// ("/v1/sandboxes//exec" is "/v1/sandboxes/exec", "/v1/sandboxes/../stats"
// is "/v1/stats"), so the caller would see a puzzling answer, or the wrong
// endpoint's.
func checkRefs(p string) error {
	p, _, _ = strings.Cut(p, "?")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if i == 0 || s != "" && s != "." && s != ".." {
			continue
		}
		kind := strings.TrimSuffix(segs[i-1], "s")
		if kind == "sandboxe" {
			kind = "sandbox"
		}
		if s == "" {
			return &Error{Code: "invalid_argument", Message: fmt.Sprintf("the %s id or name is empty: give one (see `clade ls`)", kind)}
		}
		return &Error{Code: "invalid_argument", Message: fmt.Sprintf("%q is not a %s id or name (see `clade ls`)", s, kind)}
	}
	return nil
}

func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		var ce *ConnectError
		if errors.As(err, &ce) {
			return nil, ce // "Post http://clade/...:" says nothing useful
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// `Post "http://clade/v1/fork": EOF`: the daemon stopped or was
			// killed under the call.
			return nil, fmt.Errorf("the clade daemon at %s closed the connection before answering (did it stop or restart? see its log; "+
				"a change it did not answer is there whole or not at all once it runs again: look with clade ls): %w", c.host, err)
		}
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e api.Error
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		return &Error{Status: resp.StatusCode, Code: "internal", Message: fmt.Sprintf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(b))}
	}
	return &Error{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
}

// call sends a JSON request and decodes a JSON answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Health returns the daemon's version and engine.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.call(ctx, http.MethodGet, "/v1/health", nil, &h)
}

// CreateSandbox creates a sandbox and returns once it is ready for exec.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes", req, &sb)
}

// GetSandbox returns a sandbox by id or name.
func (c *Client) GetSandbox(ctx context.Context, ref string) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref), nil, &sb)
}

// SetNetwork replaces a sandbox's egress policy (n's Egress, Allow and
// Deny; the mode cannot change) and returns the sandbox. A running sandbox
// follows it at once for new connections.
func (c *Client) SetNetwork(ctx context.Context, ref string, n Network) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(ref)+"/network", n, &sb)
}

// ChangeNetwork adds rules to and removes rules from a sandbox's egress
// policy, keeping the others (see NetworkChange), and returns the sandbox.
// The daemon reads and writes the policy under the sandbox's lock, so
// concurrent changes all apply.
func (c *Client) ChangeNetwork(ctx context.Context, ref string, ch NetworkChange) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPatch, "/v1/sandboxes/"+url.PathEscape(ref)+"/network", ch, &sb)
}

// ListSandboxes returns every sandbox.
func (c *Client) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	var sbs []Sandbox
	return sbs, c.call(ctx, http.MethodGet, "/v1/sandboxes", nil, &sbs)
}

// DeleteSandbox removes a sandbox by id or name. A sandbox that does not
// exist gives an error for which IsNotFound is true.
func (c *Client) DeleteSandbox(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(ref), nil, nil)
}

// ListImages returns the images sandboxes can be created from.
func (c *Client) ListImages(ctx context.Context) ([]Image, error) {
	var imgs []Image
	return imgs, c.call(ctx, http.MethodGet, "/v1/images", nil, &imgs)
}

// CopyTo extracts the tar archive r at path in the sandbox: into path if it
// is a directory, else as path (the archive's one top-level entry renamed).
func (c *Client) CopyTo(ctx context.Context, ref, path string, r io.Reader) error {
	return c.CopyToAs(ctx, ref, path, "", r)
}

// CopyToAs is CopyTo with every entry owned by user (a name or UID[:GID]
// of the sandbox) instead of the archive's owners; empty user is CopyTo.
func (c *Client) CopyToAs(ctx context.Context, ref, path, user string, r io.Reader) error {
	u := "/v1/sandboxes/" + url.PathEscape(ref) + "/files?path=" + url.QueryEscape(path)
	if user != "" {
		u += "&user=" + url.QueryEscape(user)
	}
	req, err := c.newRequest(ctx, http.MethodPut, u, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// CopyFrom returns a tar archive of path in the sandbox; its top-level entry
// is path's base name. The caller closes it.
func (c *Client) CopyFrom(ctx context.Context, ref, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// SnapshotSandbox freezes a running sandbox's memory, processes and files
// into a new snapshot; the sandbox keeps running.
func (c *Client) SnapshotSandbox(ctx context.Context, ref, name string) (Snapshot, error) {
	var snap Snapshot
	return snap, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/snapshot", api.SnapshotRequest{Name: name}, &snap)
}

// ListSnapshots returns every snapshot.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	var snaps []Snapshot
	return snaps, c.call(ctx, http.MethodGet, "/v1/snapshots", nil, &snaps)
}

// GetSnapshot returns a snapshot by id or name.
func (c *Client) GetSnapshot(ctx context.Context, ref string) (Snapshot, error) {
	var snap Snapshot
	return snap, c.call(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(ref), nil, &snap)
}

// DeleteSnapshot removes an unused snapshot; one that sandboxes were
// restored from gives an error for which IsConflict is true.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(ref), nil, nil)
}

// Fork restores n new sandboxes from source, a snapshot or a running
// sandbox (snapshotted first), in one call. The result has one entry per
// child, with its id or its error; the call fails as a whole only when
// nothing was attempted (bad input, admission refused).
// Options (Spread) shape the fork in a cluster.
func (c *Client) Fork(ctx context.Context, source string, n int, opts ...ForkOption) (ForkResult, error) {
	req := api.ForkRequest{Source: source, N: n}
	for _, o := range opts {
		o(&req)
	}
	var res ForkResult
	return res, c.call(ctx, http.MethodPost, "/v1/fork", req, &res)
}

// ForkOption shapes a fork request.
type ForkOption func(*api.ForkRequest)

// Spread asks a cluster to place the children across its nodes (by memory
// free after admission, as creates are placed) instead of on the node that
// holds the source. A daemon outside a cluster refuses it.
func Spread() ForkOption { return func(r *api.ForkRequest) { r.Spread = true } }

// Sleep snapshots a sandbox to disk and stops it: it keeps its id and uses
// no memory until Wake (or the next exec) restores it.
func (c *Client) Sleep(ctx context.Context, ref string) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/sleep", nil, &sb)
}

// SleepFiles puts a sandbox to sleep keeping its files but not its
// processes: its wake starts it afresh on its files, as a new sandbox
// starts (E2B's pause with memory: false).
func (c *Client) SleepFiles(ctx context.Context, ref string) (Sandbox, error) {
	var sb Sandbox
	no := false
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/sleep", api.SleepRequest{Memory: &no}, &sb)
}

// Wake restores a sleeping sandbox in place: same id, files and processes
// (only its files after SleepFiles).
// Waking a running sandbox is a no-op.
func (c *Client) Wake(ctx context.Context, ref string) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/wake", nil, &sb)
}

// WakeOn wakes a sleeping sandbox on the named node of a cluster: one
// asleep on another node is moved there first (its sleep image fetched
// from the object store). The answer's Node says where it runs.
func (c *Client) WakeOn(ctx context.Context, ref, node string) (Sandbox, error) {
	var sb Sandbox
	return sb, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/wake", api.WakeRequest{Node: node}, &sb)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
