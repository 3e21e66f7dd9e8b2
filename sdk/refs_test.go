package sdk_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

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
