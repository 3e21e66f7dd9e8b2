package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	out, err := s.svc.ListImages(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getImage answers for an image name or a reference it was pulled or
// imported as (the path segment escapes its slashes).
func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	img, err := s.svc.Image(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, img)
	return nil
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
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

func (e *eventStream) progress(p api.ImageProgress) {
	e.send(api.ImageEvent{Progress: &p})
}

// finish ends the stream with the image or the error; an error before any
// progress line is an ordinary error answer.
func (e *eventStream) finish(img api.Image, err error) error {
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
	e.send(api.ImageEvent{Image: &img})
	return nil
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImageRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ev := &eventStream{w: w, rc: http.NewResponseController(w)}
	img, err := s.svc.PullImage(r.Context(), req, ev.progress)
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
	img, err := s.svc.ImportImage(r.Context(), f.Name(), service.ImportImage{Name: q.Get("name"), Source: source}, ev.progress)
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
	return &floorReader{r: r, check: func() error { return s.svc.CheckDisk(op) }}
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
	sb, err := s.svc.CreateBuildSandbox(r.Context(), req)
	if err != nil {
		return err
	}
	defer func() {
		if err := s.svc.EndBuild(r.Context(), sb.ID); err != nil {
			s.log.Error("remove a build's sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	// As before the service: the record, with no address nor ingress.
	a := sb
	a.Ingress = nil
	if a.Network != nil {
		n := *a.Network
		n.Address = ""
		a.Network = &n
	}
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
	img, err := s.svc.Commit(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, img)
	return nil
}
