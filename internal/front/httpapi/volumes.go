package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// routeVolumes registers the volume routes.
func (s *Server) routeVolumes() {
	s.route("POST /v1/volumes", "volume_create", s.createVolume)
	s.route("GET /v1/volumes", "volume_list", s.listVolumes)
	s.route("GET /v1/volumes/{name}", "volume_inspect", s.getVolume)
	s.route("DELETE /v1/volumes/{name}", "volume_remove", s.deleteVolume)
	s.route("GET /v1/volumes/{name}/key", "volume_key", s.volumeKey)
	s.route("GET /v1/volumes/{name}/export", "volume_export", s.exportVolume)
	s.route("POST /v1/volumes/{name}/import", "volume_import", s.importVolume)
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateVolumeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	v, err := s.svc.CreateVolume(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	out, err := s.svc.ListVolumes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	v, err := s.svc.GetVolume(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.RemoveVolume(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) volumeKey(w http.ResponseWriter, r *http.Request) error {
	key, err := s.svc.VolumeKey(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, api.VolumeKey{Key: key})
	return nil
}

// exportVolume streams an encrypted volume's directory as a tar. Errors
// found before the first byte are answered as usual; a failure later cuts
// the stream (the tar is then truncated, which import refuses).
func (s *Server) exportVolume(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.svc.VolumeKey(r.Context(), r.PathValue("name")); err != nil {
		return err // not found, not encrypted: before any byte is sent
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if err := s.svc.ExportVolume(r.Context(), r.PathValue("name"), w); err != nil {
		s.log.Warn("volume export failed", "volume", r.PathValue("name"), "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) importVolume(w http.ResponseWriter, r *http.Request) error {
	key := r.Header.Get(api.VolumeKeyHeader)
	if key == "" {
		// As before the service: a daemon without volumes says so first.
		if _, err := s.svc.ListVolumes(r.Context()); err != nil {
			return err
		}
		return errdefs.New(errdefs.InvalidArgument, "an import needs the volume's key in the %s header (clade volume import --key-file)", api.VolumeKeyHeader)
	}
	v, err := s.svc.ImportVolume(r.Context(), r.PathValue("name"), s.floored(r.Body, "volume import"), key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}
