package ingress

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// What the ingress answers as E2B's proxy does, for E2B code that reads
// it (the SDKs take a 502 with this message for a sandbox that is gone).

// notFoundMessage is E2B's message for a sandbox that does not exist.
const notFoundMessage = "The sandbox was not found"

// notFound answers a request to a sandbox that does not exist (or was
// removed) as E2B's proxy does: 502 with {"sandboxId", "message", "code"}.
func notFound(w http.ResponseWriter, ref string) {
	b, _ := json.Marshal(struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}{ref, notFoundMessage, http.StatusBadGateway})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusBadGateway)
	w.Write(append(b, '\n'))
}

// maskPort is the placeholder of the port in a host mask (E2B's
// maskRequestHost).
const maskPort = "${PORT}"

// MaskHost returns the Host that a sandbox with host mask mask is sent
// for a request to port: the mask with every ${PORT} replaced by it.
func MaskHost(mask string, port int) string {
	return strings.ReplaceAll(mask, maskPort, strconv.Itoa(port))
}

// CheckHostMask validates a host mask (E2B's maskRequestHost): once its
// ${PORT} is replaced, a valid Host header (a name or address, with a
// port or not), at most 255 bytes. The error is for the client.
func CheckHostMask(mask string) error {
	h := MaskHost(mask, 65535)
	if mask == "" || len(h) > 255 || !httpguts.ValidHostHeader(h) || strings.ContainsAny(h, "/?#@ ") {
		return fmt.Errorf("maskRequestHost %.300q is not a host: give a name or address, with :PORT or not, where ${PORT} stands for the port (e.g. localhost:${PORT})", mask)
	}
	return nil
}
