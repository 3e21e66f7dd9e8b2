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
	CommitRequest    = api.CommitRequest
)

// ImportImageRequest names an imported image and says where it came from.
type ImportImageRequest struct {
	// Name is the image's name; derived from the archive's tag or Source
	// when empty.
	Name string
	// Source is where the archive came from (e.g. the file name), shown as
	// the image's source.
	Source string
}

// Commit turns a sandbox's filesystem into an image (and, with Start, a
// template with a ready snapshot). The sandbox keeps running.
func (c *Client) Commit(ctx context.Context, ref string, req CommitRequest) (Image, error) {
	var img Image
	return img, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/commit", req, &img)
}

// BuildRequest is an image build: steps run in a sandbox of From (an image
// name or reference), then its filesystem becomes image Name.
type BuildRequest struct {
	Name, From string
	Env        []string // for the steps and the image
	Workdir    string
	// Copy puts host files into the sandbox before the steps: each is a
	// tar archive (see tarx) extracted at its Dest.
	Copy  []BuildCopy
	Run   []string // shell commands, in order; the first that fails stops the build
	Start string
	Ready string
	// Volumes, with Start, are mounted in the template's sandbox: the
	// template records their content (see CommitRequest.Volumes).
	Volumes []VolumeMount
	// Output receives the steps' output; nil discards it.
	Output io.Writer
}

// BuildCopy is one --copy of a build.
type BuildCopy struct {
	Dest string
	Tar  func() (io.ReadCloser, error)
}

// Build runs an image build through the API: a sandbox of From, the copies
// and steps in it, a commit, and the sandbox's removal (also on failure).
// The daemon holds the sandbox only while this call runs: if the caller
// dies or ctx ends, it removes the sandbox itself.
func (c *Client) Build(ctx context.Context, req BuildRequest) (_ Image, err error) {
	sb, end, err := c.BuildSandbox(ctx, req.From, req.Env)
	if err != nil {
		return Image{}, err
	}
	defer func() {
		derr := c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		if derr != nil && err == nil && !IsNotFound(derr) {
			err = derr
		}
		end()
	}()
	for _, cp := range req.Copy {
		r, err := cp.Tar()
		if err != nil {
			return Image{}, err
		}
		err = c.CopyTo(ctx, sb.ID, cp.Dest, r)
		r.Close()
		if err != nil {
			return Image{}, fmt.Errorf("copy to %s: %w", cp.Dest, err)
		}
	}
	out := req.Output
	if out == nil {
		out = io.Discard
	}
	for i, step := range req.Run {
		fmt.Fprintf(out, "--> step %d/%d: %s\n", i+1, len(req.Run), step)
		st, err := c.Exec(ctx, sb.ID, ExecRequest{Cmd: []string{"sh", "-c", step}, Workdir: req.Workdir, Stdout: out, Stderr: out})
		if err != nil {
			return Image{}, err
		}
		if st.Code != 0 {
			return Image{}, &Error{Code: "invalid_argument", Message: fmt.Sprintf("build step %d (%s) exited with %d", i+1, step, st.Code)}
		}
	}
	if req.Start != "" {
		fmt.Fprintf(out, "--> starting %q and waiting until it is ready\n", req.Start)
	}
	return c.Commit(ctx, sb.ID, CommitRequest{Name: req.Name, Env: req.Env, Workdir: req.Workdir, Start: req.Start, Ready: req.Ready, Volumes: req.Volumes})
}

// BuildSandbox asks the daemon for a build's sandbox (POST /v1/builds)
// from the image from, and returns it with end, which lets the daemon
// remove it. The answer stays open until end: its connection is the
// build's lease. Build uses it; so does a node that drives another's
// build (internal/service/remote).
func (c *Client) BuildSandbox(ctx context.Context, from string, env []string) (Sandbox, func(), error) {
	b, err := json.Marshal(api.BuildSandboxRequest{From: from, Env: env})
	if err != nil {
		return Sandbox{}, nil, err
	}
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/builds", bytesReader(b))
	if err != nil {
		return Sandbox{}, nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.do(hreq)
	if err != nil {
		return Sandbox{}, nil, err
	}
	line, err := bufio.NewReader(io.LimitReader(resp.Body, 1<<20)).ReadBytes('\n')
	var ev api.BuildEvent
	if err == nil {
		err = json.Unmarshal(line, &ev)
	}
	switch {
	case err != nil:
		resp.Body.Close()
		return Sandbox{}, nil, fmt.Errorf("build sandbox: %w", err)
	case ev.Error != nil:
		resp.Body.Close()
		return Sandbox{}, nil, &Error{Code: ev.Error.Code, Message: ev.Error.Message}
	case ev.Sandbox == nil:
		resp.Body.Close()
		return Sandbox{}, nil, fmt.Errorf("build sandbox: the daemon sent no sandbox")
	}
	return *ev.Sandbox, func() { resp.Body.Close() }, nil
}

// GetImage returns an image, by name or by a reference it was pulled or
// imported as, with its config and the sandboxes and snapshots using it.
func (c *Client) GetImage(ctx context.Context, name string) (Image, error) {
	var img Image
	return img, c.call(ctx, http.MethodGet, "/v1/images/"+url.PathEscape(name), nil, &img)
}

// DeleteImage removes an image, by name or reference; one in use gives an
// error for which IsConflict is true.
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
// installs it as req.Name (derived from the archive when empty).
func (c *Client) ImportImage(ctx context.Context, archive io.Reader, req ImportImageRequest, progress func(ImageProgress)) (Image, error) {
	q := url.Values{}
	if req.Name != "" {
		q.Set("name", req.Name)
	}
	if req.Source != "" {
		q.Set("source", req.Source)
	}
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/images/import?"+q.Encode(), archive)
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
