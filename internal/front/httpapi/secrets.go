package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/api"
)

// routeSecrets registers the secret routes. No route returns a value.
func (s *Server) routeSecrets() {
	s.route("PUT /v1/secrets/{name}", "secret_set", s.setSecret)
	s.route("GET /v1/secrets", "secret_list", s.listSecrets)
	s.route("DELETE /v1/secrets/{name}", "secret_remove", s.deleteSecret)
}

func (s *Server) setSecret(w http.ResponseWriter, r *http.Request) error {
	var req api.SetSecretRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sc, err := s.svc.SetSecret(r.Context(), r.PathValue("name"), req.Value)
	clear(req.Value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sc)
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) error {
	out, err := s.svc.ListSecrets(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.RemoveSecret(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
