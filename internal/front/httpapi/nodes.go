package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// listNodes answers GET /v1/nodes: the cluster's live nodes.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	c, ok := s.svc.(service.Nodes)
	if !ok {
		return errdefs.New(errdefs.InvalidArgument, "this daemon is not part of a cluster: start it with --cluster embed or --cluster etcd://HOST:2379 (see docs/cluster.md)")
	}
	ns, err := c.Nodes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ns)
	return nil
}

// drainNode answers POST (drain) and DELETE (undrain) of
// /v1/nodes/{name}/drain.
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) error {
	c, ok := s.svc.(service.Nodes)
	if !ok {
		return errdefs.New(errdefs.InvalidArgument, "this daemon is not part of a cluster: start it with --cluster embed or --cluster etcd://HOST:2379 (see docs/cluster.md)")
	}
	n, err := c.Drain(r.Context(), r.PathValue("name"), r.Method == http.MethodPost)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, n)
	return nil
}
