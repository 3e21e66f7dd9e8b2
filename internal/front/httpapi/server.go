// Package daemon serves clade's HTTP API: routing, authentication, request
// decoding, and the one mapping from error classes to HTTP status codes.
package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures the API server.
type Config struct {
	Version string
	Log     *slog.Logger
	// TmpDir holds uploads (image archives) while they are imported.
	TmpDir string
	// IngressURL, when the daemon serves an ingress, returns the URL
	// template (with {port}) of a sandbox's ports.
	IngressURL func(id string) string
	// Code carries requests to sandboxes' code interpreters
	// (codeint.Proxy); nil: the daemon serves none.
	Code CodeProxy
	// IngressCA is the PEM certificate of the CA of the ingress's TLS
	// certificate when the daemon made it (GET /v1/ingress/ca).
	IngressCA []byte
	// Node, in a cluster, labels every metric of GET /metrics node=NAME.
	Node string
	// Internal, in a cluster, serves /v1/internal/: the routes nodes call
	// on each other (cluster.Service.Internal, which checks the cluster
	// token itself). Kept off the public spec.
	Internal http.Handler
	// Cluster, in a cluster, reads across the nodes: the merged events
	// stream (GET /v1/events?cluster=true) and every node's stats (GET
	// /v1/stats).
	Cluster ClusterReads
}

// CodeProxy sends a request to the code interpreter server of a sandbox.
type CodeProxy interface {
	Do(ctx context.Context, id, method, path string, body []byte) (*http.Response, error)
	// RunBound is how long a run with this timeout may take in all before
	// the daemon stops waiting for its server.
	RunBound(timeout time.Duration) time.Duration
}

// Server is the HTTP API.
type Server struct {
	cfg     Config
	svc     service.Service
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
	tmpDir  string
	// errRunBound ends a run the interpreter server did not end in time
	// (nil without a code proxy).
	errRunBound error
	// Routes lists "METHOD /path" of every API route, for the spec test.
	Routes []string
}

// New returns the API server over the node's service.
func New(cfg Config, svc service.Service, reg *prometheus.Registry) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, svc: svc, log: cfg.Log, mux: http.NewServeMux(), metrics: newMetrics(reg), tmpDir: cfg.TmpDir}
	if cfg.Code != nil {
		s.errRunBound = errdefs.New(errdefs.Unavailable, "the code interpreter did not end the run within its timeout and %s: its server is not answering", cfg.Code.RunBound(0))
	}
	s.route("GET /v1/health", "health", s.health)
	s.route("POST /v1/sandboxes", "sandbox_create", s.createSandbox)
	s.route("GET /v1/sandboxes", "sandbox_list", s.listSandboxes)
	s.route("GET /v1/sandboxes/{id}", "sandbox_inspect", s.getSandbox)
	s.route("DELETE /v1/sandboxes/{id}", "sandbox_remove", s.deleteSandbox)
	s.route("PUT /v1/sandboxes/{id}/network", "sandbox_network", s.setNetwork)
	s.route("PATCH /v1/sandboxes/{id}/network", "sandbox_network_change", s.changeNetwork)
	s.route("POST /v1/sandboxes/{id}/exec", "exec", s.exec)
	s.route("GET /v1/sandboxes/{id}/files", "files_get", s.getFiles)
	s.route("PUT /v1/sandboxes/{id}/files", "files_put", s.putFiles)
	s.route("GET /v1/images", "image_list", s.listImages)
	s.route("GET /v1/images/{name}", "image_inspect", s.getImage)
	s.route("DELETE /v1/images/{name}", "image_remove", s.deleteImage)
	s.route("POST /v1/images/pull", "image_pull", s.pullImage)
	s.route("POST /v1/images/import", "image_import", s.importImage)
	s.route("POST /v1/builds", "build_sandbox", s.buildSandbox)
	s.route("POST /v1/sandboxes/{id}/commit", "commit", s.commit)
	s.route("POST /v1/sandboxes/{id}/snapshot", "snapshot_create", s.createSnapshot)
	s.route("GET /v1/snapshots", "snapshot_list", s.listSnapshots)
	s.route("GET /v1/snapshots/{id}", "snapshot_inspect", s.getSnapshot)
	s.route("DELETE /v1/snapshots/{id}", "snapshot_remove", s.deleteSnapshot)
	s.route("POST /v1/fork", "fork", s.fork)
	s.route("POST /v1/sandboxes/{id}/sleep", "sleep", s.sleep)
	s.route("POST /v1/sandboxes/{id}/wake", "wake", s.wake)
	s.route("POST /v1/sandboxes/{id}/timeout", "timeout", s.setTimeout)
	s.route("GET /v1/sandboxes/{id}/ports/{port}", "port_forward", s.portForward)
	s.route("POST /v1/sandboxes/{id}/ports/{port}/url", "signed_url", s.signedURL)
	s.route("GET /v1/ingress/ca", "ingress_ca", s.ingressCA)
	s.route("GET /v1/events", "events", s.events)
	s.route("GET /v1/sandboxes/{id}/stats", "sandbox_stats", s.getStats)
	s.route("GET /v1/stats", "stats_list", s.listStats)
	s.route("GET /v1/nodes", "node_list", s.listNodes)
	s.route("POST /v1/nodes/{name}/drain", "node_drain", s.drainNode)
	s.route("DELETE /v1/nodes/{name}/drain", "node_undrain", s.drainNode)
	s.routeVolumes()
	s.routeSecrets()
	s.routeCode()
	// A cluster's nodes serve E2B's commands on a sandbox another node
	// holds through these (cluster token only; off the public spec).
	kept := keptRoutes{s}
	s.routePeer("POST /v1/internal/sandboxes/{id}/exec", "exec_kept", kept.exec)
	s.routePeer("GET /v1/internal/sandboxes/{id}/kept", "kept_list", kept.list)
	s.routePeer("POST /v1/internal/sandboxes/{id}/kept/{pid}/attach", "kept_attach", kept.attach)
	// A node's own events and stats, which the others merge into theirs.
	s.routePeer("GET /v1/internal/events", "events_node", nodeEvents(s))
	s.routePeer("GET /v1/internal/stats", "stats_node", nodeStats(s))
	var g prometheus.Gatherer = reg
	if cfg.Node != "" {
		g = nodeGatherer{g: reg, node: cfg.Node}
	}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if cfg.Internal != nil {
		s.mux.Handle("/v1/internal/", cfg.Internal)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.New(errdefs.NotFound, "no such endpoint: %s %s (the API is under /v1, see api/openapi.yaml)", r.Method, r.URL.Path))
	})
	return s
}

// handlerFunc is an API handler that returns its error for writeError.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) route(pattern, op string, h handlerFunc) {
	s.Routes = append(s.Routes, pattern)
	s.handle(pattern, op, h)
}

// handle registers a route without listing it in Routes (the public
// spec's): the internal ones.
func (s *Server) handle(pattern, op string, h handlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		err := h(rec, r)
		if err != nil {
			if rec.status == 0 {
				writeError(rec, err)
			}
			if errdefs.ClassOf(err) == errdefs.Internal {
				s.log.Error("request failed", "op", op, "err", err)
			}
		}
		s.metrics.observe(op, err, time.Since(start))
	})
}

// ServeHTTP authenticates and dispatches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "panic", v, "path", r.URL.Path)
			writeError(w, fmt.Errorf("internal error: %v", v))
		}
	}()
	if err := CheckQuery(r); err != nil {
		writeError(w, err)
		return
	}
	ctx, stop := peerContext(r)
	defer stop()
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// CheckQuery refuses a request whose query string does not parse (a bad
// %-escape, a raw ';'). r.URL.Query() drops such pairs without a word, so
// ?label=a=b;c would have listed every sandbox instead of none: a filter
// a client got wrong must fail, never widen.
func CheckQuery(r *http.Request) error {
	if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "malformed query string %.100q: %v (URL-encode each value: %%3D for '=', %%3B for ';', %%25 for '%%')", r.URL.RawQuery, err)
	}
	return nil
}

// RequireToken wraps h so that every request must carry the bearer token;
// TCP listeners use it, the unix socket relies on file permissions.
func RequireToken(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 9110 11.1): "bearer" too.
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(tok), []byte(token)) != 1 {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong token: pass it as `Authorization: Bearer TOKEN` (the CLI reads CLADE_TOKEN)"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// statusOf is errdefs.HTTPStatus.
func statusOf(c errdefs.Class) int { return errdefs.HTTPStatus(c) }

func writeError(w http.ResponseWriter, err error) {
	c := errdefs.ClassOf(err)
	writeJSON(w, statusOf(c), api.Error{Code: string(c), Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// maxBody bounds JSON request bodies.
const maxBody = 1 << 20

// decode reads a JSON body strictly: unknown fields and trailing data are
// client mistakes worth telling about.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.InvalidArgument, "request body is larger than %d bytes", maxBody)
		}
		return errdefs.New(errdefs.InvalidArgument, "reading the request body: %v", err)
	}
	if t := bytes.TrimSpace(body); len(t) > 0 && t[0] != '{' {
		return errdefs.New(errdefs.InvalidArgument, "the request body must be a JSON object, not %.20q", t)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	tooLarge := func(err error) bool {
		var mbe *http.MaxBytesError
		return errors.As(err, &mbe)
	}
	if err := dec.Decode(v); err != nil {
		switch {
		case tooLarge(err):
			return errdefs.New(errdefs.InvalidArgument, "request body is larger than %d bytes", maxBody)
		case errors.Is(err, io.EOF):
			return errdefs.New(errdefs.InvalidArgument, "empty request body: send a JSON object")
		}
		return errdefs.New(errdefs.InvalidArgument, "malformed JSON body: %v", err)
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		if tooLarge(err) {
			return errdefs.New(errdefs.InvalidArgument, "request body is larger than %d bytes", maxBody)
		}
		return errdefs.New(errdefs.InvalidArgument, "malformed JSON body: unexpected data after the object")
	}
	return nil
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and Hijack.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	h, err := s.svc.Health(r.Context())
	if err != nil {
		return err
	}
	if s.cfg.Version != "" {
		h.Version = s.cfg.Version
	}
	writeJSON(w, http.StatusOK, h)
	return nil
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var req api.Network
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.svc.SetNetwork(r.Context(), r.PathValue("id"), api.Network{Mode: req.Mode, Egress: req.Egress, Allow: req.Allow, Deny: req.Deny})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

func (s *Server) changeNetwork(w http.ResponseWriter, r *http.Request) error {
	var req api.NetworkChange
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.svc.ChangeNetwork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.svc.Create(r.Context(), req)
	if err != nil {
		return err
	}
	if s.clientGone(w, r, sb.ID) {
		return nil
	}
	writeJSON(w, http.StatusCreated, s.sandboxAPI(sb))
	return nil
}

// clientGone reports whether the client of r went away (Ctrl-C, a killed
// process) before its create or fork answered, and then removes the
// sandboxes ids the call made: the create runs to its end whatever the
// client does, but a client that never learned their ids would leave them
// running, and holding their memory, until someone noticed.
func (s *Server) clientGone(w http.ResponseWriter, r *http.Request, ids ...string) bool {
	if r.Context().Err() == nil {
		return false
	}
	s.svc.RemoveAbandoned(r.Context(), r.URL.Path, ids...)
	// Not an empty 200: a client still reading (a TCP one that shut down
	// its writes, see peerContext) learns what happened.
	writeError(w, errdefs.New(errdefs.Unavailable, "the connection was closed before the answer, so what the call made (%s) was removed: keep the connection open for writing until the answer comes", strings.Join(ids, ", ")))
	return true
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	want, err := labelFilter(r)
	if err != nil {
		return err
	}
	sbs, err := s.svc.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		if hasLabels(sb.Labels, want) {
			out = append(out, s.sandboxAPI(sb))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Remove(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
