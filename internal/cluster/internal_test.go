package cluster

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// nullPorter answers every image as not being sent and refuses imports.
type nullPorter struct{ imports int }

func (p *nullPorter) Export(context.Context, string, int) (SnapshotMeta, func(), error) {
	return SnapshotMeta{}, nil, errdefs.New(errdefs.NotFound, "none")
}

func (p *nullPorter) Open(digest string) (string, func(), error) {
	return "", nil, errdefs.New(errdefs.NotFound, "no snapshot image %.80s is being sent from this node", digest)
}

func (p *nullPorter) Import(context.Context, SnapshotMeta, int, func(context.Context, string) error,
	func(context.Context, string) (io.ReadCloser, error)) (api.ForkResult, error) {
	p.imports++
	return api.ForkResult{}, errdefs.New(errdefs.Conflict, "refused")
}

func (p *nullPorter) SendRoot(_ context.Context, id string, _ func() io.Writer) error {
	return errdefs.New(errdefs.NotFound, "this node holds no image root %.80s", id)
}

// TestInternalRoutes: /v1/internal/ takes the cluster token only (the
// daemon mounts it on the unix socket too, where no other check runs):
// no token, another scheme, the API token, a prefix of the cluster token
// are 401s; the cluster token reaches the routes, which check what a peer
// sends (an import naming this node, or an unknown field, is a 400; one
// naming a node not in the cluster a 503; never an import).
func TestInternalRoutes(t *testing.T) {
	cli := startEtcd(t)
	c, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:1", LeaseTTL: 2 * time.Second, Token: "cluster-secret",
		Capacity: func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{Cores: 2}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := NewService(c, nil)
	p := &nullPorter{}
	s.SetPorter(p)
	h := s.Internal()
	call := func(method, path, auth, body string) int {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	const img = "/v1/internal/snapshots/sha256:0123456789012345678901234567890123456789012345678901234567890123"
	const root = "/v1/internal/roots/sha256:0123456789012345678901234567890123456789012345678901234567890123"
	for _, auth := range []string{"", "Bearer", "Bearer ", "Basic cluster-secret", "Bearer api-token", "Bearer cluster-secre", "Bearer cluster-secret2"} {
		if got := call(http.MethodGet, img, auth, ""); got != http.StatusUnauthorized {
			t.Errorf("GET an image with %q: %d, want 401", auth, got)
		}
		if got := call(http.MethodPost, "/v1/internal/fork/import", auth, `{"n":1,"origin":"b"}`); got != http.StatusUnauthorized {
			t.Errorf("import with %q: %d, want 401", auth, got)
		}
		if got := call(http.MethodGet, root, auth, ""); got != http.StatusUnauthorized {
			t.Errorf("GET an image root with %q: %d, want 401", auth, got)
		}
	}
	const tok = "Bearer cluster-secret"
	if got := call(http.MethodGet, img, tok, ""); got != http.StatusNotFound {
		t.Errorf("GET an image not being sent: %d, want 404", got)
	}
	if got := call(http.MethodGet, root, tok, ""); got != http.StatusNotFound {
		t.Errorf("GET an image root not held: %d, want 404", got)
	}
	for body, want := range map[string]int{
		`{"n":1,"origin":"a"}`:             http.StatusBadRequest, // this node
		`{"n":1}`:                          http.StatusBadRequest,
		`{"n":1,"origin":"b","extra":1}`:   http.StatusBadRequest,
		`{`:                                http.StatusBadRequest,
		`{"n":1,"origin":"nobody"}`:        http.StatusServiceUnavailable,
		`{"n":1,"origin":"../../etc/foo"}`: http.StatusServiceUnavailable,
	} {
		if got := call(http.MethodPost, "/v1/internal/fork/import", tok, body); got != want {
			t.Errorf("import %s: %d, want %d", body, got, want)
		}
	}
	if p.imports != 0 {
		t.Fatalf("%d imports ran", p.imports)
	}
}
