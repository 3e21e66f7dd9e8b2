package system

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/front/e2b"
	"github.com/clade-sandbox/clade/internal/service"
)

// serveE2B serves the E2B API on o.E2B until the returned stop is called.
func serveE2B(o Options, svc service.Service, code *codeint.Proxy, ingress *ingressListener, log *slog.Logger, errc chan<- error) (stop func(), err error) {
	if o.Token == "" {
		return nil, errors.New("--e2b needs --token-file: E2B clients send the token as E2B_API_KEY, and an API without one would let anyone who reaches the port run code")
	}
	cfg := e2b.Config{APIKey: o.Token, DiskDir: o.DataDir, DiskFloorMiB: o.Sandbox.DiskFloorMiB, BaseImage: o.E2BBaseImage, Log: log, Code: code}
	if ingress != nil {
		// The SDK's getHost(port) is PORT-ID.DOMAIN: an ingress on
		// another port than 80 rides on the domain, so that the host it
		// returns reaches it.
		cfg.Domain = strings.Trim(o.IngressDomain, ".") + ingress.port()
	}
	srv, err := e2b.New(cfg, svc)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.E2B)
	if err != nil {
		return nil, fmt.Errorf("e2b: listen on %s: %w", o.E2B, err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() { errc <- hs.Serve(limitAPI(ln, "e2b", log)) }()
	log.Info("serving the E2B API", "addr", ln.Addr().String())
	return func() { hs.Close(); srv.Close() }, nil
}
