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

func (p *nullPorter) Export(context.Context, string, int) (api.SnapshotExport, func(), error) {
	return api.SnapshotExport{}, nil, errdefs.New(errdefs.NotFound, "none")
}

func (p *nullPorter) Open(digest string) (string, func(), error) {
	return "", nil, errdefs.New(errdefs.NotFound, "no snapshot image %.80s is being sent from this node", digest)
}

func (p *nullPorter) Import(context.Context, api.SnapshotExport, int, func(context.Context, string) error,
	func(context.Context, string) (io.ReadCloser, error), func([]string) error) (api.ForkResult, error) {
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

// readingPorter imports by reading the root it is sent (to its end or an
// error) and then fetching the snapshot, as sandbox.Porter does.
type readingPorter struct {
	nullPorter
	rootErr, snapErr chan error
}

func (p *readingPorter) Import(ctx context.Context, _ api.SnapshotExport, _ int, fetch func(context.Context, string) error,
	fetchRoot func(context.Context, string) (io.ReadCloser, error), _ func([]string) error) (api.ForkResult, error) {
	rc, err := fetchRoot(ctx, "sha256:0123456789012345678901234567890123456789012345678901234567890123")
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
	}
	p.rootErr <- err
	p.snapErr <- fetch(ctx, "/nonexistent/dir")
	return api.ForkResult{}, errdefs.New(errdefs.Conflict, "refused")
}

// TestImportFetchBounded: an import's fetches from an origin that stops
// sending mid-stream (partitioned, stuck) end within the import's bound
// (the origin gave up on the import by then): they held the root's fetch,
// the snapshot's lock and the children's memory for ever.
func TestImportFetchBounded(t *testing.T) {
	defer func(d time.Duration) { importTimeout = d }(importTimeout)
	importTimeout = 2 * time.Second
	gone := make(chan struct{})
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte{0, 0})
		w.(http.Flusher).Flush()
		select { // and nothing more
		case <-r.Context().Done():
		case <-gone:
		}
	}))
	defer origin.Close()
	defer close(gone)
	cli := startEtcd(t)
	c := joinAt(t, cli, "a", "127.0.0.1:1")
	defer c.Close()
	b := joinAt(t, cli, "b", origin.Listener.Addr().String())
	defer b.Close()
	s := NewService(c, nil)
	p := &readingPorter{rootErr: make(chan error, 1), snapErr: make(chan error, 1)}
	s.SetPorter(p)
	answered := make(chan int, 1)
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/internal/fork/import", strings.NewReader(`{"n":1,"origin":"b"}`))
		r.Header.Set("Authorization", "Bearer cluster-secret")
		w := httptest.NewRecorder()
		s.Internal().ServeHTTP(w, r)
		answered <- w.Code
	}()
	for what, ch := range map[string]chan error{"the root's fetch": p.rootErr} {
		select {
		case err := <-ch:
			if err == nil {
				t.Fatalf("%s: no error from a cut stream", what)
			}
			t.Logf("%s: %v", what, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s from an origin that stopped sending still waits 30 s on (the import's bound is %s)", what, importTimeout)
		}
	}
	select {
	case err := <-p.snapErr:
		if err == nil {
			t.Fatal("the snapshot's fetch: no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the snapshot's fetch from an origin that stopped sending still waits 30 s on")
	}
	select {
	case code := <-answered:
		t.Logf("import answered %d", code)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the import")
	}
}
