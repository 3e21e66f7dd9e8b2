package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/store"
)

// routeSecrets registers the secret routes. No route returns a value.
func (s *Server) routeSecrets() {
	s.route("PUT /v1/secrets/{name}", "secret_set", s.setSecret)
	s.route("GET /v1/secrets", "secret_list", s.listSecrets)
	s.route("DELETE /v1/secrets/{name}", "secret_remove", s.deleteSecret)
}

func (s *Server) secrets() (*secret.Manager, error) {
	if s.cfg.Secrets == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no secrets")
	}
	return s.cfg.Secrets, nil
}

func secretToAPI(sc store.Secret, users []string) api.Secret {
	return api.Secret{Name: sc.Name, Version: sc.Version, CreatedAt: sc.CreatedAt.UTC(), UpdatedAt: sc.UpdatedAt.UTC(), UsedBy: users}
}

func secretRefsFromAPI(refs []api.SecretRef) []store.SecretRef {
	var out []store.SecretRef
	for _, r := range refs {
		out = append(out, store.SecretRef{Name: r.Name, Env: r.Env, File: r.File})
	}
	return out
}

func secretRefsToAPI(refs []store.SecretRef) []api.SecretRef {
	var out []api.SecretRef
	for _, r := range refs {
		out = append(out, api.SecretRef{Name: r.Name, Env: r.Env, File: r.File, Version: r.Version})
	}
	return out
}

func (s *Server) setSecret(w http.ResponseWriter, r *http.Request) error {
	secrets, err := s.secrets()
	if err != nil {
		return err
	}
	var req api.SetSecretRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sc, err := secrets.Set(r.Context(), r.PathValue("name"), req.Value)
	clear(req.Value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretToAPI(sc, nil))
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) error {
	secrets, err := s.secrets()
	if err != nil {
		return err
	}
	list, err := secrets.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Secret, 0, len(list))
	for _, in := range list {
		out = append(out, secretToAPI(in.Secret, in.Users))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	secrets, err := s.secrets()
	if err != nil {
		return err
	}
	if err := secrets.Remove(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
