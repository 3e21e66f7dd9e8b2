package httpapi

import (
	"net/http"
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
func (s *Server) listStats(w http.ResponseWriter, r *http.Request) error {
	want, err := labelFilter(r)
	if err != nil {
		return err
	}
	out, err := s.svc.ListStats(r.Context(), r.URL.Query()["id"], want)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
