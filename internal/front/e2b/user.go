package e2b

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// DefaultUser is who E2B runs commands and writes files as when the
// client names nobody (envd >= 0.4.0 clients send no user then): the
// account create prepares (userSetup).
const DefaultUser = "user"

// maxUserName bounds a user name from a client.
const maxUserName = 256

// headerUser is the user an envd RPC names in its `Authorization: Basic
// base64(user:)` header, or "" for none.
func headerUser(h http.Header) (string, error) {
	a := h.Get("Authorization")
	if a == "" {
		return "", nil
	}
	scheme, cred, _ := strings.Cut(a, " ")
	if !strings.EqualFold(scheme, "Basic") {
		return "", errdefs.New(errdefs.InvalidArgument, "Authorization: give Basic base64(user:) to name the user")
	}
	if len(cred) > 4*maxUserName {
		return "", errdefs.New(errdefs.InvalidArgument, "Authorization: the user name is over %d bytes", maxUserName)
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errdefs.New(errdefs.InvalidArgument, "Authorization: not base64 (%v): give Basic base64(user:)", err)
	}
	user, _, _ := strings.Cut(string(b), ":")
	return checkUserName(user)
}

// checkUserName refuses a user name no account can have.
func checkUserName(user string) (string, error) {
	if len(user) > maxUserName || strings.ContainsAny(user, "\x00\n/") {
		return "", errdefs.New(errdefs.InvalidArgument, "user %.64q: give a user name of the sandbox, e.g. user or root", user)
	}
	return user, nil
}

// execUser is who a request in sandbox id runs as: the one it names, else
// DefaultUser. A sandbox whose agent predates users (an old snapshot) runs
// what names nobody as root, as before; one that names a user gets the
// agent's error.
func (s *Server) execUser(ctx context.Context, id, named string) (string, error) {
	if named != "" {
		return named, nil
	}
	ok, err := s.svc.SupportsUser(ctx, id, service.Wake)
	if err != nil || !ok {
		return "", err
	}
	return DefaultUser, nil
}
