package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/api"
)

// TestClusterBenchSameNodeTwice: --nodes naming one node twice (the same
// address, or two addresses of one daemon) is refused before any case
// runs: the exec, fork and wake cases would measure that node against
// itself and print it as "another node".
func TestClusterBenchSameNodeTwice(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/nodes" {
			calls++
			http.Error(w, `{"code":"not_found","message":"no"}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode([]api.Node{{Name: "n1", Self: true}, {Name: "n2"}})
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runClusterBench(t.Context(), clusterBenchConfig{Nodes: []string{srv.URL, srv.URL}, Storm: 1, Samples: 1, EtcdWriteRate: 1,
		Fork: 1, Rounds: 1, MemoryMiB: 256, Cases: []string{"wake"}}, &out)
	if err == nil || !strings.Contains(err.Error(), "n1") || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("--nodes with one node twice: %v, want a refusal naming n1 twice (output %q)", err, out.String())
	}
	if calls != 0 {
		t.Fatalf("%d calls besides the node list were made", calls)
	}
}
