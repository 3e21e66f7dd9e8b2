package sdk

import (
	"context"
	"encoding/json"
	"io"
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

// VolumeKey returns an encrypted volume's key (hex): with ExportVolume's
// archive it opens the volume on another host.
func (c *Client) VolumeKey(ctx context.Context, ref string) (string, error) {
	var k api.VolumeKey
	return k.Key, c.call(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(ref)+"/key", nil, &k)
}

// ExportVolume writes an encrypted volume as a tar of its ciphertext to
// w. The key is not in it: get it with VolumeKey.
func (c *Client) ExportVolume(ctx context.Context, ref string, w io.Writer) error {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(ref)+"/export", nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// ImportVolume makes volume name of an archive ExportVolume wrote and its
// key. A key that does not open it gives an error saying so, and nothing
// is imported.
func (c *Client) ImportVolume(ctx context.Context, name string, archive io.Reader, key string) (Volume, error) {
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(name)+"/import", archive)
	if err != nil {
		return Volume{}, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set(api.VolumeKeyHeader, key)
	resp, err := c.do(req)
	if err != nil {
		return Volume{}, err
	}
	defer resp.Body.Close()
	var v Volume
	return v, json.NewDecoder(resp.Body).Decode(&v)
}
