package httpapi

import (
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// keptRoutes serve the agent's kept commands to the nodes of a cluster
// (routePeer): a node serving E2B's commands on a sandbox this node holds
// starts them (exec with keep and tag), lists them and attaches to them.
type keptRoutes struct{ s *Server }

// exec is exec with keep and tag, for the cluster's nodes (routePeer):
// a node serving E2B's commands on a sandbox this node holds.
func (k keptRoutes) exec(w http.ResponseWriter, r *http.Request) error {
	s := k.s
	req, err := decodeExec(r)
	if err != nil {
		return err
	}
	return s.serveExec(w, r, req)
}

// list answers a sandbox's kept commands (a cluster's nodes only).
func (k keptRoutes) list(w http.ResponseWriter, r *http.Request) error {
	s := k.s
	wake, err := wakeQuery(r)
	if err != nil {
		return err
	}
	kept, err := s.svc.Kept(r.Context(), r.PathValue("id"), wake)
	if err != nil {
		return err
	}
	if kept == nil {
		kept = []api.KeptCommand{}
	}
	writeJSON(w, http.StatusOK, kept)
	return nil
}

// attach follows a kept command by pid as exec follows the command it
// starts (a cluster's nodes only): ?stdin=true writes to its stdin (on a
// two-way stream); a client that goes away detaches, and the command runs
// on.
func (k keptRoutes) attach(w http.ResponseWriter, r *http.Request) error {
	s := k.s
	if v := r.Header.Get(stream.VersionHeader); v != "" && v != strconv.Itoa(stream.Version) {
		return errdefs.New(errdefs.InvalidArgument, "exec stream version %q is not supported: this daemon speaks version %d; upgrade the client or the daemon", v, stream.Version)
	}
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errdefs.New(errdefs.InvalidArgument, "pid %.40q: give the pid of a kept command (a positive number)", r.PathValue("pid"))
	}
	wake, err := wakeQuery(r)
	if err != nil {
		return err
	}
	stdin := false
	if v := r.URL.Query().Get("stdin"); v != "" {
		if stdin, err = strconv.ParseBool(v); err != nil {
			return errdefs.New(errdefs.InvalidArgument, "stdin=%.40q: give true or false", v)
		}
	}
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), api.UpgradeProtocol)
	if stdin && !upgrade {
		return errdefs.New(errdefs.InvalidArgument, "stdin needs a two-way stream: send the request with `Connection: Upgrade` and `Upgrade: %s`", api.UpgradeProtocol)
	}
	// The request has no body: one sent anyway is read now, or it would
	// be taken for the first frames of an upgraded stream.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10)); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "read the request: %v", err)
	}
	p, err := s.svc.Attach(r.Context(), r.PathValue("id"), wake, pid, stdin)
	if err != nil {
		return err
	}
	return s.streamExec(w, r, p, upgrade)
}
