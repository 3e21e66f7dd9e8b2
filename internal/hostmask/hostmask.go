// Package hostmask is E2B's maskRequestHost: the Host header the ingress
// gives a sandbox's servers instead of the one the client sent, with
// ${PORT} standing for the port asked for. The E2B front and clade's API
// check a mask at create; the ingress applies it.
package hostmask

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// portVar is the placeholder of the port in a mask.
const portVar = "${PORT}"

// Apply returns the Host that a sandbox with mask is sent for a request to
// port: the mask with every ${PORT} replaced by it.
func Apply(mask string, port int) string {
	return strings.ReplaceAll(mask, portVar, strconv.Itoa(port))
}

// Check validates a mask: once its ${PORT} is replaced, a valid Host
// header (a name or address, with a port or not), at most 255 bytes. The
// error is for the client.
func Check(mask string) error {
	h := Apply(mask, 65535)
	if mask == "" || len(h) > 255 || !httpguts.ValidHostHeader(h) || strings.ContainsAny(h, "/?#@ ") {
		return fmt.Errorf("maskRequestHost %.300q is not a host: give a name or address, with :PORT or not, where ${PORT} stands for the port (e.g. localhost:${PORT})", mask)
	}
	return nil
}
