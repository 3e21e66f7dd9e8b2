package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// signedKey is the context key under which checkSigned leaves the id of
// the sandbox a signed file URL verified against.
type signedKey struct{}

// maxSignature bounds the signature parameter: a v1 signature is "v1_"
// and 43 characters of base64.
const maxSignature = 128

// fileSignature is E2B's v1 signature of a file URL: the SHA-256, in
// base64 without padding, of path:operation:user:token, and :expiry when
// the URL expires. path and user are the query's own values (the path as
// the client gave it, "" for no user); operation is "read" or "write".
func fileSignature(path, operation, user, token, expiry string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiry != "" {
		raw += ":" + expiry
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// checkSigned verifies a signed /files request (signature and
// signature_expiration in the query, no X-Access-Token) and returns the
// request to serve: with E2b-Sandbox-Id set to the sandbox whose envd
// access token the signature verifies against, and that id in its
// context. A request that names its sandbox (E2b-Sandbox-Id) is checked
// against that sandbox's token only; one that does not (a URL built on
// E2B_SANDBOX_URL, fetched by anyone) is checked against each sandbox's,
// so the sandbox is the one whose secret signed it, never one a parameter
// names. The messages are envd's.
func (s *Server) checkSigned(r *http.Request) (*http.Request, error) {
	q := r.URL.Query()
	sig := q.Get("signature")
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return nil, errdefs.New(errdefs.InvalidArgument, "a signed file URL is for GET (download) or POST (upload), not %s", r.Method)
	}
	expiry := q.Get("signature_expiration")
	var exp int64
	if q.Has("signature_expiration") {
		var err error
		if exp, err = strconv.ParseInt(expiry, 10, 64); err != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "signature_expiration %.32q: give the expiry in Unix seconds", expiry)
		}
	}
	if len(sig) > maxSignature || !strings.HasPrefix(sig, "v1_") {
		return nil, errdefs.New(errdefs.Unauthenticated, "invalid signature")
	}
	path, user := q.Get("path"), q.Get("username")
	match := func(id string) bool {
		want := fileSignature(path, op, user, s.accessToken(id), expiry)
		return subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1
	}
	id := r.Header.Get("E2b-Sandbox-Id")
	if id != "" {
		if !match(id) {
			return nil, errdefs.New(errdefs.Unauthenticated, "invalid signature")
		}
	} else {
		list, err := s.svc.List(r.Context())
		if err != nil {
			return nil, err
		}
		for _, sb := range list {
			if match(sb.ID) {
				id = sb.ID
				break
			}
		}
		if id == "" {
			return nil, errdefs.New(errdefs.Unauthenticated, "invalid signature")
		}
	}
	if q.Has("signature_expiration") && exp < time.Now().Unix() {
		return nil, errdefs.New(errdefs.Unauthenticated, "signature is already expired")
	}
	r = r.WithContext(context.WithValue(r.Context(), signedKey{}, id))
	r.Header.Set("E2b-Sandbox-Id", id)
	r.Header.Del("E2b-Sandbox-Port")
	return r, nil
}
