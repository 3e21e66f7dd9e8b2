package ingress

import (
	"encoding/json"
	"net/http"
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
