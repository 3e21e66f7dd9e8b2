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
	out := api.Image{Name: img.Name, Ref: image.FamiliarRef(img.Ref), Source: img.Source, SizeBytes: img.SizeBytes, CreatedAt: img.CreatedAt,
		Platform: img.Platform, ManifestDigest: img.ManifestDigest, Layers: img.Layers, UsedBy: users, Snapshot: img.Snapshot}
	c := img.Config
	if len(c.Env) > 0 || c.WorkingDir != "" || c.User != "" || len(c.Entrypoint) > 0 || len(c.Cmd) > 0 {
		out.Config = &api.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	}
	return out
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	imgs, err := s.mgr.ListImages(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Image, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, imageToAPI(img, nil))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getImage answers for an image name or a reference it was pulled or
// imported as (the path segment escapes its slashes).
func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	img, users, err := s.mgr.Image(r.Context(), r.PathValue("name"))
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
// request body; the query names the image (name) and says where it came
// from (source, the client's file name).
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	source := q.Get("source")
	if source == "" {
		source = "upload" // not the temporary file it is read from
	}
	if err := checkText("source", source, 4096); err != nil {
		return err
	}
	if err := checkText("name", q.Get("name"), 64); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.tmpDir, "import-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = io.Copy(f, s.floored(r.Body, "image import"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errdefs.ClassOf(err) != errdefs.Internal {
			return err
		}
		return errdefs.New(errdefs.InvalidArgument, "reading the uploaded archive: %v", err)
	}
	ev := &eventStream{w: w, rc: http.NewResponseController(w)}
	img, err := s.mgr.ImportImage(r.Context(), f.Name(), image.ImportOptions{Name: q.Get("name"), Source: source, Progress: ev.progress})
	return ev.finish(img, err)
}

// floorReader reads r and, every floorEvery bytes, asks check whether the
// disk may take more: an upload written to the data dir (an archive
// spooled for import, a volume imported) must not fill its file system;
// the daemon's disk floor stops it with check's error.
type floorReader struct {
	r     io.Reader
	check func() error
	n     int64 // bytes read
	next  int64 // at which the next check is due
}

const floorEvery = 16 << 20

func (f *floorReader) Read(p []byte) (int, error) {
	if f.n >= f.next {
		if err := f.check(); err != nil {
			return 0, err
		}
		f.next = f.n + floorEvery
	}
	if rest := f.next - f.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := f.r.Read(p)
	f.n += int64(n)
	return n, err
}

// floored is r stopped by the daemon's disk floor, for op.
func (s *Server) floored(r io.Reader, op string) io.Reader {
	return &floorReader{r: r, check: func() error { return s.mgr.CheckDisk(op) }}
}

// checkText refuses a query parameter that is too long or holds control
// characters: it is shown back in messages and listings.
func checkText(param, v string, max int) error {
	if len(v) > max {
		return errdefs.New(errdefs.InvalidArgument, "%s of %d bytes: at most %d", param, len(v), max)
	}
	for _, c := range v {
		if c < ' ' || c == 0x7f {
			return errdefs.New(errdefs.InvalidArgument, "bad %s %q: no control characters", param, v)
		}
	}
	return nil
}

// buildSandbox serves the sandbox of a client-driven image build: it
// answers with the sandbox at once and holds the answer open; when the
// client closes it, or the client or its connection dies, the sandbox is
// removed. The client runs its steps and commits through the ordinary
// routes meanwhile.
func (s *Server) buildSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.BuildSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	// Until the body is read to its end, the server does not watch the
	// connection, and the request's context would not end with it.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBody))
	sb, err := s.mgr.CreateBuildSandbox(r.Context(), sandbox.CreateRequest{Image: req.From, Env: req.Env})
	if err != nil {
		return err
	}
	defer func() {
		if err := s.mgr.EndBuild(r.Context(), sb.ID); err != nil {
			s.log.Error("remove a build's sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	a := toAPI(sb)
	b, _ := json.Marshal(api.BuildEvent{Sandbox: &a})
	_, _ = w.Write(append(b, '\n'))
	_ = http.NewResponseController(w).Flush()
	<-r.Context().Done()
	return nil
}

func (s *Server) commit(w http.ResponseWriter, r *http.Request) error {
	var req api.CommitRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	img, err := s.mgr.Commit(r.Context(), r.PathValue("id"), sandbox.CommitRequest{Name: req.Name, Env: req.Env, Workdir: req.Workdir,
		Start: req.Start, Ready: req.Ready, ReadyTimeout: time.Duration(req.ReadyTimeoutMS) * time.Millisecond, Volumes: volumeMountsFromAPI(req.Volumes)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, imageToAPI(img, nil))
	return nil
}
