package sdk

import (
	"context"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

// Volume types of the API, re-exported for SDK users.
type (
	Volume              = api.Volume
	VolumeMount         = api.VolumeMount
	CreateVolumeRequest = api.CreateVolumeRequest
)

// CreateVolume makes a named volume; sandboxes mount it with
// CreateSandboxRequest.Volumes. A taken name gives an error for which
// IsConflict is true.
func (c *Client) CreateVolume(ctx context.Context, req CreateVolumeRequest) (Volume, error) {
	var v Volume
	return v, c.call(ctx, http.MethodPost, "/v1/volumes", req, &v)
}

// ListVolumes returns every volume.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var vs []Volume
	return vs, c.call(ctx, http.MethodGet, "/v1/volumes", nil, &vs)
}

// GetVolume returns a volume by name or id.
func (c *Client) GetVolume(ctx context.Context, ref string) (Volume, error) {
	var v Volume
	return v, c.call(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(ref), nil, &v)
}

// DeleteVolume removes a volume and its data. A volume that sandboxes
// mount gives an error for which IsConflict is true, naming them.
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(ref), nil, nil)
}
