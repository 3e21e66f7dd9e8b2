package httpapi

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/internal/service"
)

// trafficToken is the sandbox's traffic token (the service hands it in
// Ingress, with no URL: the ingress is this front's).
func trafficToken(a api.Sandbox) string {
	if a.Ingress == nil {
		return ""
	}
	return a.Ingress.TrafficToken
}

// sandboxAPI is the service's sandbox with the daemon's ingress URLs, when
// it serves an ingress (else no Ingress at all).
func (s *Server) sandboxAPI(a api.Sandbox) api.Sandbox {
	tok, mask := trafficToken(a), ""
	if a.Ingress != nil {
		mask = a.Ingress.HostMask
	}
	a.Ingress = nil
	if s.cfg.IngressURL != nil {
		a.Ingress = &api.Ingress{URL: s.cfg.IngressURL(a.ID), TokenHeader: ingress.TokenHeader, TrafficToken: tok, HostMask: mask}
	}
	return a
}

// labelFilter reads the repeatable ?label=K=V filter of a sandbox listing
// (and of the event stream).
func labelFilter(r *http.Request) (map[string]string, error) {
	var want map[string]string
	for _, kv := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, errdefs.New(errdefs.InvalidArgument, "label filter %q: use label=KEY=VALUE", kv)
		}
		if old, dup := want[k]; dup && old != v {
			return nil, errdefs.New(errdefs.InvalidArgument, "label filter %s given twice (%q, %q): a sandbox has one value per key", k, old, v)
		}
		if want == nil {
			want = map[string]string{}
		}
		want[k] = v
	}
	return want, nil
}

// hasLabels reports whether labels hold every pair of want.
func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req api.TimeoutRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.svc.SetTimeout(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

// maxSignedTTL bounds a signed URL's life.
const maxSignedTTL = 30 * 24 * time.Hour

// signedURL answers a URL of one port of a sandbox through the ingress that
// needs no traffic token until it expires.
func (s *Server) signedURL(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errdefs.New(errdefs.InvalidArgument, "port %q: give a TCP port, 1 to 65535", r.PathValue("port"))
	}
	var req api.SignedURLRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ttl := time.Duration(req.TTLMS) * time.Millisecond
	switch {
	case req.TTLMS == 0:
		ttl = time.Hour
	case req.TTLMS < 0 || ttl > maxSignedTTL:
		return errdefs.New(errdefs.InvalidArgument, "ttl_ms %d is out of range: give 1 ms to 30 days (0: one hour)", req.TTLMS)
	}
	if s.cfg.IngressURL == nil {
		return errdefs.New(errdefs.Conflict, "this daemon serves no ingress: start it with --ingress ADDR --ingress-domain DOMAIN, or use `clade port-forward`")
	}
	sb, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	tok := trafficToken(sb)
	base := strings.Replace(s.cfg.IngressURL(sb.ID), "{port}", strconv.Itoa(port), 1) + "/"
	exp := time.Now().Add(ttl).Truncate(time.Second)
	if sb.Public {
		writeJSON(w, http.StatusOK, api.SignedURL{URL: base, ExpiresAt: exp})
		return nil
	}
	if tok == "" {
		return errdefs.New(errdefs.Conflict, "sandbox %s has no traffic token (it was made before the ingress existed): recreate it", sb.ID)
	}
	writeJSON(w, http.StatusOK, api.SignedURL{URL: ingress.SignURL(base, tok, sb.ID, port, exp), ExpiresAt: exp})
	return nil
}

// portForward connects to a port inside the sandbox (waking it) and, after
// `101 Switching Protocols`, carries the raw bytes of that TCP connection
// both ways, half-closes included.
func (s *Server) portForward(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errdefs.New(errdefs.InvalidArgument, "port %q: give a TCP port, 1 to 65535", r.PathValue("port"))
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), api.TCPUpgradeProtocol) {
		return errdefs.New(errdefs.InvalidArgument, "a port connection needs a two-way stream: send the request with `Connection: Upgrade` and `Upgrade: %s`", api.TCPUpgradeProtocol)
	}
	rec, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	release := s.svc.Hold(rec.ID) // busy while the connection is open
	defer release()
	sc, err := s.svc.Dial(r.Context(), rec.ID, service.Wake, port)
	if err != nil {
		return err
	}
	defer sc.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return err
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + api.TCPUpgradeProtocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		return nil
	}
	up := make(chan struct{})
	go func() {
		defer close(up)
		// brw.Reader first: it may hold bytes the client sent early.
		if _, err := io.Copy(sc, brw.Reader); err != nil {
			sc.Close()
			return
		}
		if cw, ok := sc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	if _, err := io.Copy(conn, sc); err != nil {
		conn.Close()
	} else if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	<-up
	return nil
}

// ingressCA returns the certificate of the CA that signed the ingress's
// TLS certificate, when the daemon made that CA itself.
func (s *Server) ingressCA(w http.ResponseWriter, r *http.Request) error {
	if len(s.cfg.IngressCA) == 0 {
		if s.cfg.IngressURL == nil {
			return errdefs.New(errdefs.NotFound, "this daemon serves no ingress: start it with --ingress ADDR --ingress-domain DOMAIN --ingress-tls")
		}
		return errdefs.New(errdefs.NotFound, "this daemon's ingress has no CA of its own: it serves plain HTTP (start it with --ingress-tls) or the --ingress-tls-cert it was given, whose issuer is the one to trust")
	}
	writeJSON(w, http.StatusOK, api.IngressCA{PEM: string(s.cfg.IngressCA)})
	return nil
}
