// Package e2b serves the E2B API on clade: the REST API the E2B SDKs call
// to create and manage sandboxes, and envd's protocol (Connect, over
// HTTP/1.1) they call to run commands and move files in one. Both are on one
// listener: a request that names a sandbox in E2b-Sandbox-Id is envd
// traffic, anything else is the REST API.
//
// Everything is translated onto the node's service (internal/service):
// sandboxes' lifecycle, and commands and files run by clade's own agent;
// E2B's envd does not run in the sandbox. See docs/e2b.md for what is supported call by call.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process/processconnect"
	"github.com/clade-sandbox/clade/internal/front/httpapi"
	"github.com/clade-sandbox/clade/internal/service"
)

// EnvdVersion is the envd version clade reports. The SDKs gate features on
// it; every feature gated at or below it is implemented (docs/e2b.md lists
// the gates of the pinned clients): recursive watches (0.1.4), metrics
// (0.1.5, 0.2.4), stdin control (0.3.0), no default user (0.4.0),
// closeStdin (0.5.2), octet-stream and gzip uploads (0.5.7), file metadata
// on upload (0.6.2, metadata.go), the watch's includeEntry (0.6.3) and
// allowNetworkMounts (0.6.4: taken; a clade sandbox has no network mounts
// of its own to refuse). 0.6.4 is the last version the clients gate on.
const EnvdVersion = "0.6.4"

// Home is the home directory of the user E2B code assumes; relative paths
// resolve from it.
const Home = "/home/user"

// Config configures the E2B front.
type Config struct {
	// APIKey is the key clients send as X-API-KEY (clade's token).
	APIKey string
	// Domain, when the daemon serves an ingress, is its domain: the SDK's
	// getHost(port) is PORT-ID.Domain.
	Domain string
	// DiskDir is a directory on the file system sandboxes' files take
	// (the data dir): an upload may not take more than it has free above
	// DiskFloorMiB. Empty: no bound but the sandbox's disk cap.
	DiskDir      string
	DiskFloorMiB int
	// BaseImage is the image E2B's `base` template (the SDKs' default)
	// runs on: image.E2BBase, built from Debian's packages with what
	// E2B's base holds; "" is clade's lean default image (DefaultImage).
	BaseImage string
	Log       *slog.Logger
	// Code carries requests for port 49999 to sandboxes' code
	// interpreters (codeint.Proxy); nil: none.
	Code httpapi.CodeProxy
}

// Server serves the E2B REST API and envd on one handler.
type Server struct {
	cfg   Config
	svc   service.Service
	log   *slog.Logger
	rest  *http.ServeMux
	envd  *http.ServeMux
	procs *processes
	// hist is E2B's metrics history (metrics.go), sampled until
	// stopSampling is called.
	hist         metricsRings
	stopSampling context.CancelFunc
	// accounts are the roots whose sandboxes need no account setup.
	accounts accounts
}

// New returns the E2B front over the node's service. It returns an
// InvalidArgument error without an API key: the front runs code for anyone
// who knows it.
func New(cfg Config, svc service.Service) (*Server, error) {
	if cfg.APIKey == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "the E2B front needs an API key: give the daemon --token-file (clients send it as E2B_API_KEY)")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, svc: svc, log: cfg.Log, rest: http.NewServeMux(), envd: http.NewServeMux(), procs: newProcesses(),
		hist: metricsRings{rings: map[string]*ring{}}, stopSampling: func() {}}
	if svc != nil {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopSampling = cancel
		go s.sampleLoop(ctx)
	}
	s.routes()
	ps := &processService{s: s}
	path, h := processconnect.NewProcessHandler(ps, connectLimits...)
	s.envd.Handle(path, h)
	fsvc := &filesystemService{s: s}
	path, h = filesystemconnect.NewFilesystemHandler(fsvc, connectLimits...)
	s.envd.Handle(path, h)
	s.envd.HandleFunc("GET /files", s.wrap(s.getFile))
	s.envd.HandleFunc("POST /files", s.wrap(s.postFiles))
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.New(errdefs.NotFound, "no such envd endpoint: %s %s", r.Method, r.URL.Path))
	})
	return s, nil
}

// Close kills the processes the front still tracks and stops sampling.
func (s *Server) Close() {
	s.stopSampling()
	s.procs.closeAll()
}

// ServeHTTP authenticates and dispatches: envd traffic by the sandbox it
// names, the rest to the REST API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("e2b handler panic", "panic", v, "path", r.URL.Path)
			writeError(w, fmt.Errorf("internal error: %v", v))
		}
	}()
	if err := httpapi.CheckQuery(r); err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Path == "/files" && r.Header.Get("X-Access-Token") == "" && r.URL.Query().Has("signature") {
		// A signed file URL (sbx.downloadUrl, uploadUrl): it carries no
		// access token, and through E2B_SANDBOX_URL not even the sandbox.
		signed, err := s.checkSigned(r)
		if err != nil {
			writeError(w, err)
			return
		}
		r = signed
	}
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		if port, err := sandboxPort(r); err != nil {
			writeError(w, err)
			return
		} else if port != 0 {
			// A port of the sandbox (the code interpreter's): E2B's
			// proxy lets these through on the traffic token, not envd's.
			sb, err := s.get(r.Context(), id)
			if err != nil {
				if errdefs.IsNotFound(err) {
					writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("The sandbox %s was not found: %v", id, err)})
					return
				}
				writeError(w, err)
				return
			}
			s.servePort(w, r, sb, port)
			return
		}
		tok := r.Header.Get("X-Access-Token")
		if signed, _ := r.Context().Value(signedKey{}).(string); signed == id && signed != "" {
			tok = s.accessToken(id)
		}
		if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.accessToken(id))) != 1 {
			writeError(w, errdefs.New(errdefs.Unauthenticated, "missing or wrong X-Access-Token for sandbox %s: use the envdAccessToken its create or connect returned", id))
			return
		}
		// E2B's proxy answers 502 for a sandbox that is gone: the SDKs
		// read it as the sandbox's end (TimeoutError, isRunning false).
		sb, err := s.get(r.Context(), id)
		if err != nil {
			if errdefs.IsNotFound(err) {
				writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("The sandbox %s was not found: %v", id, err)})
				return
			}
			writeError(w, err)
			return
		}
		if r.URL.Path == "/health" {
			// A paused sandbox is not running; asking must not wake it.
			if stateOf(sb) != "running" {
				writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("The sandbox %s is paused", id)})
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		s.envd.ServeHTTP(w, r)
		return
	}
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			key = b
		}
	}
	if subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) != 1 {
		writeError(w, errdefs.New(errdefs.Unauthenticated, "Invalid API key: set E2B_API_KEY to the clade daemon's token (its --token-file)"))
		return
	}
	s.rest.ServeHTTP(w, r)
}

// accessToken is the envd access token of sandbox id: derived from the API
// key, so it needs no storage and survives restarts, and one sandbox's
// token opens no other.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	m.Write([]byte("clade-e2b-envd\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// apiError is E2B's error body; the SDKs read code.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf is errdefs.HTTPStatus.
func statusOf(c errdefs.Class) int { return errdefs.HTTPStatus(c) }

// statusError is an answer envd gives that no error class maps to: 413
// for an upload over what the sandbox can hold, 507 for a sandbox disk
// that filled up (the SDKs' NotEnoughSpaceError).
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

func writeError(w http.ResponseWriter, err error) {
	st := statusOf(errdefs.ClassOf(err))
	if se := (*statusError)(nil); errors.As(err, &se) {
		st = se.status
	}
	writeJSON(w, st, apiError{Code: st, Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// wrap turns a handler that returns its error into an http.HandlerFunc.
func (s *Server) wrap(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			if se := (*statusError)(nil); errdefs.ClassOf(err) == errdefs.Internal && !errors.As(err, &se) {
				s.log.Error("e2b request failed", "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	}
}
