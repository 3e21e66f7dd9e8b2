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
}

func (s *Server) volumes() (*volume.Manager, error) {
	if s.cfg.Volumes == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no volumes")
	}
	return s.cfg.Volumes, nil
}

func volumeToAPI(in volume.Info) api.Volume {
	return api.Volume{ID: in.ID, Name: in.Name, SizeBytes: in.SizeBytes, UsedBytes: in.UsedBytes, CreatedAt: in.CreatedAt.UTC(),
		UsedBy: in.Users, Mounted: in.Mounted}
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
	v, err := vols.Create(r.Context(), req.Name, req.SizeBytes)
	if err != nil {
		return err
	}
	in, err := vols.Get(r.Context(), v.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeToAPI(in))
	return nil
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
