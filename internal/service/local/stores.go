package local

import (
	"context"
	"io"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/volume"
)

// stores is the part of the service over the node's named volumes and
// sealed secrets: it touches no sandbox, so it holds only their managers.
type stores struct {
	cfg Config
}

// Volumes.

func (s *stores) volumes() (*volume.Manager, error) {
	if s.cfg.Volumes == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no volumes")
	}
	return s.cfg.Volumes, nil
}

func volumeToAPI(in volume.Info) api.Volume {
	return api.Volume{ID: in.ID, Name: in.Name, SizeBytes: in.SizeBytes, UsedBytes: in.UsedBytes, CreatedAt: in.CreatedAt.UTC(),
		UsedBy: in.Users, Mounted: in.Mounted, Encrypted: in.Encrypted()}
}

func (s *stores) made(ctx context.Context, vols *volume.Manager, v store.Volume, err error) (api.Volume, error) {
	if err != nil {
		return api.Volume{}, err
	}
	in, err := vols.Get(ctx, v.ID)
	if err != nil {
		return api.Volume{}, err
	}
	return volumeToAPI(in), nil
}

func (s *stores) CreateVolume(ctx context.Context, req api.CreateVolumeRequest) (api.Volume, error) {
	vols, err := s.volumes()
	if err != nil {
		return api.Volume{}, err
	}
	if req.Key != "" {
		if !req.Encrypt {
			return api.Volume{}, errdefs.New(errdefs.InvalidArgument, "a volume key needs encrypt: true (clade volume create --encrypt --key-file FILE)")
		}
		v, err := vols.CreateWithKey(ctx, req.Name, req.SizeBytes, req.Key)
		return s.made(ctx, vols, v, err)
	}
	v, err := vols.Create(ctx, req.Name, req.SizeBytes, req.Encrypt)
	return s.made(ctx, vols, v, err)
}

func (s *stores) ListVolumes(ctx context.Context) ([]api.Volume, error) {
	vols, err := s.volumes()
	if err != nil {
		return nil, err
	}
	list, err := vols.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Volume, 0, len(list))
	for _, in := range list {
		out = append(out, volumeToAPI(in))
	}
	return out, nil
}

func (s *stores) GetVolume(ctx context.Context, ref string) (api.Volume, error) {
	vols, err := s.volumes()
	if err != nil {
		return api.Volume{}, err
	}
	in, err := vols.Get(ctx, ref)
	if err != nil {
		return api.Volume{}, err
	}
	return volumeToAPI(in), nil
}

func (s *stores) RemoveVolume(ctx context.Context, ref string) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	return vols.Remove(ctx, ref)
}

func (s *stores) VolumeKey(ctx context.Context, ref string) (string, error) {
	vols, err := s.volumes()
	if err != nil {
		return "", err
	}
	return vols.Key(ctx, ref)
}

func (s *stores) ExportVolume(ctx context.Context, ref string, w io.Writer) error {
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	return vols.Export(ctx, ref, w)
}

func (s *stores) ImportVolume(ctx context.Context, name string, r io.Reader, key string) (api.Volume, error) {
	vols, err := s.volumes()
	if err != nil {
		return api.Volume{}, err
	}
	v, err := vols.Import(ctx, name, r, key)
	return s.made(ctx, vols, v, err)
}

// Secrets.

func (s *stores) secrets() (*secret.Manager, error) {
	if s.cfg.Secrets == nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no secrets")
	}
	return s.cfg.Secrets, nil
}

func secretToAPI(sc store.Secret, users []string) api.Secret {
	return api.Secret{Name: sc.Name, Version: sc.Version, CreatedAt: sc.CreatedAt.UTC(), UpdatedAt: sc.UpdatedAt.UTC(), UsedBy: users}
}

func (s *stores) SetSecret(ctx context.Context, name string, value []byte) (api.Secret, error) {
	secrets, err := s.secrets()
	if err != nil {
		return api.Secret{}, err
	}
	sc, err := secrets.Set(ctx, name, value)
	if err != nil {
		return api.Secret{}, err
	}
	return secretToAPI(sc, nil), nil
}

func (s *stores) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	secrets, err := s.secrets()
	if err != nil {
		return nil, err
	}
	list, err := secrets.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Secret, 0, len(list))
	for _, in := range list {
		out = append(out, secretToAPI(in.Secret, in.Users))
	}
	return out, nil
}

func (s *stores) RemoveSecret(ctx context.Context, name string) error {
	secrets, err := s.secrets()
	if err != nil {
		return err
	}
	return secrets.Remove(ctx, name)
}
