package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// getStats answers GET /v1/sandboxes/{id}/stats. A reading never wakes a
// sleeping sandbox nor counts as its use.
func (s *Server) getStats(w http.ResponseWriter, r *http.Request) error {
	st, err := s.svc.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// listStats answers GET /v1/stats: a reading of every sandbox, or of those
// named by ?id= (repeatable, ids or names), or of those with ?label=K=V.
// On a node of a cluster, every node's sandboxes (each with its node),
// unless ?cluster=false.
func (s *Server) listStats(w http.ResponseWriter, r *http.Request) error {
	cluster := true
	if v := r.URL.Query().Get("cluster"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "cluster=%q: give true or false", v)
		}
		cluster = b
	}
	if cluster && s.cfg.Cluster != nil {
		return readStats(w, r, s.cfg.Cluster.ListStats)
	}
	return readStats(w, r, s.svc.ListStats)
}

// nodeStats is GET /v1/internal/stats: the node's own sandboxes' use, for
// the cluster's other nodes.
func nodeStats(s *Server) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error { return readStats(w, r, s.svc.ListStats) }
}

func readStats(w http.ResponseWriter, r *http.Request, list func(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error)) error {
	want, err := labelFilter(r)
	if err != nil {
		return err
	}
	out, err := list(r.Context(), r.URL.Query()["id"], want)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
