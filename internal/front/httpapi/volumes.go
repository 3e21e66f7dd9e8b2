package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/volume"
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

func (s *Server) volumes() (*volume.Manager, error) {
	if s.cfg.Volumes == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no volumes")
	}
	return s.cfg.Volumes, nil
}

func volumeToAPI(in volume.Info) api.Volume {
	return api.Volume{ID: in.ID, Name: in.Name, SizeBytes: in.SizeBytes, UsedBytes: in.UsedBytes, CreatedAt: in.CreatedAt.UTC(),
		UsedBy: in.Users, Mounted: in.Mounted, Encrypted: in.Encrypted()}
}

// volumeMountsFromAPI is a create request's volumes for the store.
func volumeMountsFromAPI(vms []api.VolumeMount) []store.VolumeMount {
	var out []store.VolumeMount
	for _, vm := range vms {
		out = append(out, store.VolumeMount{Name: vm.Name, Path: vm.Path, ReadOnly: vm.ReadOnly, Shared: vm.Shared, Clone: vm.Clone})
	}
	return out
}

// volumeMountsToAPI is a sandbox's volumes as the API shows them.
func volumeMountsToAPI(vms []store.VolumeMount) []api.VolumeMount {
	var out []api.VolumeMount
	for _, vm := range vms {
		out = append(out, api.VolumeMount{Name: vm.Name, Path: vm.Path, ReadOnly: vm.ReadOnly, Shared: vm.Shared, Clone: vm.Clone})
	}
	return out
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	var req api.CreateVolumeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	var v store.Volume
	if req.Key != "" {
		if !req.Encrypt {
			return errdefs.New(errdefs.InvalidArgument, "a volume key needs encrypt: true (clade volume create --encrypt --key-file FILE)")
		}
		v, err = vols.CreateWithKey(r.Context(), req.Name, req.SizeBytes, req.Key)
	} else {
		v, err = vols.Create(r.Context(), req.Name, req.SizeBytes, req.Encrypt)
	}
	if err != nil {
		return err
	}
	return writeMade(w, r, vols, v.ID)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	list, err := vols.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Volume, 0, len(list))
	for _, in := range list {
		out = append(out, volumeToAPI(in))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	in, err := vols.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeToAPI(in))
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	if err := vols.Remove(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) volumeKey(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	key, err := vols.Key(r.Context(), r.PathValue("name"))
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
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	if _, err := vols.Key(r.Context(), r.PathValue("name")); err != nil {
		return err // not found, not encrypted: before any byte is sent
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if err := vols.Export(r.Context(), r.PathValue("name"), w); err != nil {
		s.log.Warn("volume export failed", "volume", r.PathValue("name"), "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) importVolume(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	key := r.Header.Get(api.VolumeKeyHeader)
	if key == "" {
		return errdefs.New(errdefs.InvalidArgument, "an import needs the volume's key in the %s header (clade volume import --key-file)", api.VolumeKeyHeader)
	}
	v, err := vols.Import(r.Context(), r.PathValue("name"), s.floored(r.Body, "volume import"), key)
	if err != nil {
		return err
	}
	return writeMade(w, r, vols, v.ID)
}

// writeMade answers 201 with the volume id just made (created or
// imported), as inspect shows it.
func writeMade(w http.ResponseWriter, r *http.Request, vols *volume.Manager, id string) error {
	in, err := vols.Get(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeToAPI(in))
	return nil
}
