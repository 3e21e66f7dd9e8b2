package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// The code interpreter's routes carry requests to the server inside the
// sandbox (internal/codeint), which answers in E2B's wire; its errors
// come back as clade's.
func (s *Server) routeCode() {
	s.route("POST /v1/sandboxes/{id}/code", "code_run", s.runCode)
	s.route("GET /v1/sandboxes/{id}/code/contexts", "code_context_list", s.codeContexts)
	s.route("POST /v1/sandboxes/{id}/code/contexts", "code_context_create", s.createCodeContext)
	s.route("DELETE /v1/sandboxes/{id}/code/contexts/{ctx}", "code_context_remove", s.codeContextOp)
	s.route("POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart", "code_context_restart", s.codeContextOp)
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	var req api.RunCodeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Context != "" && req.Language != "" {
		return errdefs.New(errdefs.InvalidArgument, "give a context or a language, not both")
	}
	if req.TimeoutMS < 0 {
		return errdefs.New(errdefs.InvalidArgument, "timeout_ms must not be negative")
	}
	body := map[string]any{"code": req.Code, "env_vars": req.Env}
	if req.Context != "" {
		body["context_id"] = req.Context
	}
	if req.Language != "" {
		body["language"] = req.Language
	}
	if req.TimeoutMS > 0 && s.cfg.Code != nil {
		body["timeout"] = float64(req.TimeoutMS) / 1000
		// The server ends the run at its timeout; the daemon does not
		// wait without end for one that does not (wedged, or not clade's).
		bound := s.cfg.Code.RunBound(time.Duration(req.TimeoutMS) * time.Millisecond)
		ctx, cancel := context.WithTimeoutCause(r.Context(), bound, s.errRunBound)
		defer cancel()
		r = r.WithContext(ctx)
	}
	return s.codeCall(w, r, http.MethodPost, "/execute", body)
}

func (s *Server) codeContexts(w http.ResponseWriter, r *http.Request) error {
	return s.codeCall(w, r, http.MethodGet, "/contexts", nil)
}

func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateCodeContextRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	return s.codeCall(w, r, http.MethodPost, "/contexts", req)
}

func (s *Server) codeContextOp(w http.ResponseWriter, r *http.Request) error {
	ctx := r.PathValue("ctx")
	if ctx == "" || len(ctx) > 128 {
		return errdefs.New(errdefs.InvalidArgument, "bad context id")
	}
	path := "/contexts/" + url.PathEscape(ctx)
	if r.Method == http.MethodPost {
		path += "/restart"
	}
	return s.codeCall(w, r, r.Method, path, nil)
}

// codeCall sends one request to the sandbox's interpreter server and
// streams its answer back, flushing as it comes.
func (s *Server) codeCall(w http.ResponseWriter, r *http.Request, method, path string, body any) error {
	if s.cfg.Code == nil {
		return errdefs.New(errdefs.Unavailable, "this daemon serves no code interpreter")
	}
	rec, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	release := s.svc.Hold(rec.ID)
	defer release()
	var b []byte
	if body != nil {
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	resp, err := s.cfg.Code.Do(r.Context(), rec.ID, method, path, b)
	if err != nil {
		if c := context.Cause(r.Context()); c == s.errRunBound {
			return c
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		var e struct {
			Error string `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = string(raw)
		}
		class := errdefs.InvalidArgument
		switch resp.StatusCode {
		case http.StatusNotFound:
			class = errdefs.NotFound
		case http.StatusTooManyRequests:
			class = errdefs.ResourceExhausted
		case http.StatusInternalServerError:
			class = errdefs.Internal
		}
		return errdefs.New(class, "code interpreter: %s", e.Error)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	fl := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	atLine := true
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil
			}
			atLine = buf[n-1] == '\n'
			_ = fl.Flush()
		}
		if rerr != nil {
			// A run cut at its bound ends with an error saying so (when
			// the answer stopped between two events).
			if context.Cause(r.Context()) == s.errRunBound && atLine {
				ev, _ := json.Marshal(api.CodeEvent{Type: "error", Name: "TimeoutError", Value: s.errRunBound.Error()})
				_, _ = w.Write(append(ev, '\n'))
				_, _ = w.Write([]byte(`{"type":"end_of_execution"}` + "\n"))
				_ = fl.Flush()
			}
			return nil
		}
	}
}
