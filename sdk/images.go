package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

// Image types of the API, re-exported.
type (
	ImageConfig      = api.ImageConfig
	ImageProgress    = api.ImageProgress
	PullImageRequest = api.PullImageRequest
)

// GetImage returns an image with its config and the sandboxes and
// snapshots using it.
func (c *Client) GetImage(ctx context.Context, name string) (Image, error) {
	var img Image
	return img, c.call(ctx, http.MethodGet, "/v1/images/"+url.PathEscape(name), nil, &img)
}

// DeleteImage removes an image; one in use gives an error for which
// IsConflict is true.
func (c *Client) DeleteImage(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/images/"+url.PathEscape(name), nil, nil)
}

// PullImage pulls an image from a registry into the daemon's store, calling
// progress (if not nil) as layers arrive.
func (c *Client) PullImage(ctx context.Context, req PullImageRequest, progress func(ImageProgress)) (Image, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return Image{}, err
	}
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/images/pull", bytesReader(b))
	if err != nil {
		return Image{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	return c.imageStream(hreq, progress)
}

// ImportImage uploads a `docker save` tarball or an OCI layout tar and
// installs it as name (derived from the archive when empty).
func (c *Client) ImportImage(ctx context.Context, archive io.Reader, name string, progress func(ImageProgress)) (Image, error) {
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/images/import?name="+url.QueryEscape(name), archive)
	if err != nil {
		return Image{}, err
	}
	hreq.Header.Set("Content-Type", "application/x-tar")
	return c.imageStream(hreq, progress)
}

// imageStream reads a pull or import's NDJSON answer.
func (c *Client) imageStream(hreq *http.Request, progress func(ImageProgress)) (Image, error) {
	resp, err := c.do(hreq)
	if err != nil {
		return Image{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.ImageEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return Image{}, fmt.Errorf("image stream: %w", err)
		}
		switch {
		case ev.Error != nil:
			return Image{}, &Error{Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Image != nil:
			return *ev.Image, nil
		case ev.Progress != nil && progress != nil:
			progress(*ev.Progress)
		}
	}
	if err := sc.Err(); err != nil {
		return Image{}, fmt.Errorf("image stream: %w", err)
	}
	return Image{}, fmt.Errorf("image stream ended without a result")
}
