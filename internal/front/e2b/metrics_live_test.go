package e2b_test

import (
	"net/http"
	"testing"

	"github.com/clade-sandbox/clade/sdk"
)

// TestMetricsWithoutShell: getMetrics of a sandbox whose /bin/sh its user
// removed still answers (from the host's reading), where it answered the
// in-sandbox sample's failure (fork/exec /bin/sh).
func TestMetricsWithoutShell(t *testing.T) {
	d, url, key := startE2B(t)
	var sb created
	if st, _ := rest(t, "POST", url+"/sandboxes", key, map[string]any{"templateID": "base", "timeout": 300}, &sb); st != http.StatusCreated {
		t.Fatalf("create: status %d", st)
	}
	if st, err := d.Client.Exec(t.Context(), sb.SandboxID, sdk.ExecRequest{Cmd: []string{"rm", "-f", "/bin/sh", "/usr/bin/sh"}}); err != nil || st.Code != 0 {
		t.Fatalf("rm /bin/sh: %+v %v", st, err)
	}
	var ms []struct {
		MemUsed  int64 `json:"memUsed"`
		MemTotal int64 `json:"memTotal"`
		CPUCount int   `json:"cpuCount"`
	}
	if st, _ := rest(t, "GET", url+"/sandboxes/"+sb.SandboxID+"/metrics", key, nil, &ms); st != http.StatusOK || len(ms) == 0 || ms[0].MemTotal == 0 {
		t.Fatalf("getMetrics of a sandbox without /bin/sh: %d %+v", st, ms)
	}
}
