package sdk_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// An empty, "." or ".." id must be refused by the client: sent, the
// daemon's router cleans the path into another endpoint's
// ("/v1/sandboxes//exec" is "/v1/sandboxes/exec").
func TestEmptyOrDotRefsRefused(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, `{"code":"not_found","message":"reached the daemon"}`, http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"", ".", ".."} {
		calls := map[string]func() error{
			"GetSandbox":    func() error { _, err := c.GetSandbox(t.Context(), ref); return err },
			"DeleteSandbox": func() error { return c.DeleteSandbox(t.Context(), ref) },
			"Stats":         func() error { _, err := c.Stats(t.Context(), ref); return err },
			"Sleep":         func() error { _, err := c.Sleep(t.Context(), ref); return err },
			"Exec": func() error {
				_, err := c.Exec(t.Context(), ref, sdk.ExecRequest{Cmd: []string{"true"}})
				return err
			},
			"CopyFrom": func() error {
				rc, err := c.CopyFrom(t.Context(), ref, "/etc/hostname")
				if err == nil {
					rc.Close()
				}
				return err
			},
			"DeleteSnapshot": func() error { return c.DeleteSnapshot(t.Context(), ref) },
			"DeleteVolume":   func() error { return c.DeleteVolume(t.Context(), ref) },
		}
		for name, call := range calls {
			err := call()
			if !sdk.IsInvalidArgument(err) {
				t.Errorf("%s(%q): %v, want an invalid_argument error", name, ref, err)
				continue
			}
			if !strings.Contains(err.Error(), "id or name") || strings.Contains(err.Error(), "sandboxe ") {
				t.Errorf("%s(%q): %q does not say what is wrong", name, ref, err)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests reached the daemon", n)
	}
	// A real id still goes out, escaped.
	if _, err := c.GetSandbox(t.Context(), "a/../b"); !sdk.IsNotFound(err) {
		t.Errorf("GetSandbox(a/../b): %v, want the daemon's not_found", err)
	}
}

// A signed URL's ttl travels in whole milliseconds and 0 is the daemon's
// default of an hour: a positive ttl under a millisecond must be refused,
// not rounded into an hour-long URL.
func TestSignedURLSubMillisecondTTLRefused(t *testing.T) {
	var gotBody atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody.Store(string(b))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"url":"http://x/","expires_at":"2030-01-01T00:00:00Z"}`))
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{time.Nanosecond, 999 * time.Microsecond, -time.Second} {
		if _, err := c.SignedURL(t.Context(), "box", 8000, ttl); !sdk.IsInvalidArgument(err) {
			t.Errorf("SignedURL ttl %s: %v, want an invalid_argument error", ttl, err)
		}
	}
	if b := gotBody.Load(); b != nil {
		t.Errorf("a refused ttl reached the daemon: %s", b)
	}
	if _, err := c.SignedURL(t.Context(), "box", 8000, time.Millisecond); err != nil {
		t.Fatalf("SignedURL 1ms: %v", err)
	}
	if b, _ := gotBody.Load().(string); !strings.Contains(b, `"ttl_ms":1`) {
		t.Errorf("SignedURL 1ms sent %q, want ttl_ms 1", b)
	}
}

// A secret over MaxSecretBytes is refused by the client with the daemon's
// words, not sent to fail as a request body over its limit.
func TestSetSecretTooLargeRefused(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"name":"s","version":1}`))
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.SetSecret(t.Context(), "s", make([]byte, sdk.MaxSecretBytes+1))
	if !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "at most 65536") {
		t.Fatalf("SetSecret of MaxSecretBytes+1: %v, want an invalid_argument error saying the limit", err)
	}
	if hits.Load() != 0 {
		t.Fatal("a too large secret reached the daemon")
	}
	if _, err := c.SetSecret(t.Context(), "s", make([]byte, sdk.MaxSecretBytes)); err != nil || hits.Load() != 1 {
		t.Fatalf("SetSecret of MaxSecretBytes: %v (%d requests)", err, hits.Load())
	}
}

// A daemon that hangs up under a call (stopped, killed) is said so, not as
// `Post "http://clade/v1/fork": EOF`.
func TestDaemonHungUpSaid(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Fork(t.Context(), "box", 2)
	if err == nil || !strings.Contains(err.Error(), "closed the connection before answering") || !strings.Contains(err.Error(), srv.URL) {
		t.Fatalf("fork against a daemon that hangs up: %v", err)
	}
}
