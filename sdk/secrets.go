package sdk

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

// Secret types of the API, re-exported for SDK users.
type (
	Secret    = api.Secret
	SecretRef = api.SecretRef
)

// MaxSecretBytes bounds a secret's value.
const MaxSecretBytes = api.MaxSecretBytes

// SetSecret stores a new version of secret name, sealed with the daemon's
// host key. Sandboxes created from now on get it (CreateSandboxRequest.Secrets);
// running ones keep the version they have. A value over MaxSecretBytes is
// an InvalidArgument error.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) (Secret, error) {
	if len(value) > MaxSecretBytes {
		// Sent, its JSON would pass the daemon's request body limit with
		// an error that says nothing of secrets.
		return Secret{}, &Error{Code: "invalid_argument", Message: fmt.Sprintf("secret %s is %d bytes: at most %d", name, len(value), MaxSecretBytes)}
	}
	var sc Secret
	return sc, c.call(ctx, http.MethodPut, "/v1/secrets/"+url.PathEscape(name), api.SetSecretRequest{Value: value}, &sc)
}

// ListSecrets returns every secret's name, version and dates (never values).
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var scs []Secret
	return scs, c.call(ctx, http.MethodGet, "/v1/secrets", nil, &scs)
}

// DeleteSecret removes a secret; one that sandboxes use gives an error for
// which IsConflict is true, naming them.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil)
}
