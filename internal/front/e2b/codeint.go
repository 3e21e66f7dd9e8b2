package e2b

import (
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// CodeInterpreterTemplate is the template @e2b/code-interpreter creates by
// default; it is clade's code-interpreter image.
const CodeInterpreterTemplate = "code-interpreter-v1"

// envdPort is the port E2B's SDKs name for envd itself.
const envdPort = 49983

// sandboxPort is the port a request with E2b-Sandbox-Id names in
// E2b-Sandbox-Port: 0 for envd's (or none given).
func sandboxPort(r *http.Request) (int, error) {
	h := r.Header.Get("E2b-Sandbox-Port")
	if h == "" {
		return 0, nil
	}
	p, err := strconv.Atoi(h)
	if err != nil || p < 1 || p > 65535 {
		return 0, errdefs.New(errdefs.InvalidArgument, "E2b-Sandbox-Port %q is not a TCP port", h)
	}
	if p == envdPort {
		return 0, nil
	}
	return p, nil
}

// portAllowed reports whether the request may reach a port of sb other
// than envd's: as through E2B's proxy, a public sandbox's ports are open,
// a private one's need its traffic token (or the envd token).
func (s *Server) portAllowed(r *http.Request, sb api.Sandbox) bool {
	if sb.Public {
		return true
	}
	var traffic string
	if sb.Ingress != nil {
		traffic = sb.Ingress.TrafficToken
	}
	if t := r.Header.Get("E2b-Traffic-Access-Token"); t != "" && traffic != "" &&
		subtle.ConstantTimeCompare([]byte(t), []byte(traffic)) == 1 {
		return true
	}
	t := r.Header.Get("X-Access-Token")
	return t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(s.accessToken(sb.ID))) == 1
}

// servePort carries a request to the code interpreter (port 49999) of
// sandbox sb: the only port besides envd's the front serves; others are
// the ingress's.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, sb api.Sandbox, port int) {
	if port != codeint.Port || s.cfg.Code == nil {
		writeError(w, errdefs.New(errdefs.NotFound, "port %d of sandbox %s is not served here: reach it through the ingress (%d-%s.<domain>)", port, sb.ID, port, sb.ID))
		return
	}
	if !s.portAllowed(r, sb) {
		writeJSON(w, http.StatusForbidden, apiError{Code: http.StatusForbidden, Message: "missing or wrong traffic access token for sandbox " + sb.ID})
		return
	}
	var body []byte
	if r.Body != nil && r.Method != http.MethodGet && r.Method != http.MethodDelete {
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8<<20))
		if err != nil {
			writeError(w, errdefs.New(errdefs.InvalidArgument, "request body: %v", err))
			return
		}
		body = b
	}
	release := s.svc.Hold(sb.ID)
	defer release()
	path := r.URL.EscapedPath()
	resp, err := s.cfg.Code.Do(r.Context(), sb.ID, r.Method, path, body)
	if err != nil {
		writeError(w, fmt.Errorf("code interpreter: %w", err))
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Content-Length"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	fl := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			_ = fl.Flush()
		}
		if rerr != nil {
			return
		}
	}
}
