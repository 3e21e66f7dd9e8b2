package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox"
)

func imageToAPI(img image.Image, users []string) api.Image {
	out := api.Image{Name: img.Name, Source: img.Source, SizeBytes: img.SizeBytes, CreatedAt: img.CreatedAt,
		Platform: img.Platform, ManifestDigest: img.ManifestDigest, Layers: img.Layers, UsedBy: users, Snapshot: img.Snapshot}
	c := img.Config
	if len(c.Env) > 0 || c.WorkingDir != "" || c.User != "" || len(c.Entrypoint) > 0 || len(c.Cmd) > 0 {
		out.Config = &api.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	}
	return out
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	img, err := s.images.Get(r.Context(), name)
	if errdefs.IsInvalidArgument(err) && image.ValidName(name) {
		// To create, an unknown image is bad input; to look up, it is
		// simply not there.
		return errdefs.New(errdefs.NotFound, "no image %q: see `clade image ls`", name)
	}
	if err != nil {
		return err
	}
	users, err := s.mgr.ImageUsers(r.Context(), img.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, imageToAPI(img, users))
	return nil
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	if err := s.mgr.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// eventStream writes a pull or import as NDJSON: progress lines while it
// runs, then the image or the error. Once streaming started, errors travel
// in the stream, not in the status code.
type eventStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (e *eventStream) send(ev api.ImageEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started {
		e.w.Header().Set("Content-Type", "application/x-ndjson")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	b, _ := json.Marshal(ev)
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.rc.Flush()
}

func (e *eventStream) progress(p image.Progress) {
	e.send(api.ImageEvent{Progress: &api.ImageProgress{Layer: p.Layer, LayersDone: p.LayersDone, LayersTotal: p.LayersTotal,
		BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, Cached: p.Cached}})
}

// finish ends the stream with the image or the error; an error before any
// progress line is an ordinary error answer.
func (e *eventStream) finish(img image.Image, err error) error {
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	if err != nil {
		if !started {
			return err
		}
		e.send(api.ImageEvent{Error: &api.Error{Code: string(errdefs.ClassOf(err)), Message: err.Error()}})
		return nil
	}
	a := imageToAPI(img, nil)
	e.send(api.ImageEvent{Image: &a})
	return nil
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImageRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return errdefs.New(errdefs.InvalidArgument, "ref is empty: name an image, e.g. python:3.12-slim")
	}
	ev := &eventStream{w: w, rc: http.NewResponseController(w)}
	img, err := s.mgr.PullImage(r.Context(), req.Ref, image.PullOptions{Name: req.Name, Platform: req.Platform, Insecure: req.Insecure, Progress: ev.progress})
	return ev.finish(img, err)
}

// importImage takes a `docker save` tarball or an OCI layout tar as the
// request body.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) error {
	f, err := os.CreateTemp(s.tmpDir, "import-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = io.Copy(f, r.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "reading the uploaded archive: %v", err)
	}
	ev := &eventStream{w: w, rc: http.NewResponseController(w)}
	img, err := s.mgr.ImportImage(r.Context(), f.Name(), image.ImportOptions{Name: r.URL.Query().Get("name"), Progress: ev.progress})
	return ev.finish(img, err)
}

func (s *Server) commit(w http.ResponseWriter, r *http.Request) error {
	var req api.CommitRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	img, err := s.mgr.Commit(r.Context(), r.PathValue("id"), sandbox.CommitRequest{Name: req.Name, Env: req.Env, Workdir: req.Workdir,
		Start: req.Start, Ready: req.Ready, ReadyTimeout: time.Duration(req.ReadyTimeoutMS) * time.Millisecond})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, imageToAPI(img, nil))
	return nil
}
