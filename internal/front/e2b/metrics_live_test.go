package e2b_test

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/sdk"
)

// TestMetricsWithoutShell: getMetrics of a sandbox whose /bin/sh its user
// removed still answers (from the host's reading), where it answered the
// in-sandbox sample's failure (fork/exec /bin/sh).
func TestMetricsWithoutShell(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
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

// TestMetricsHostileOutput: getMetrics runs programs of the sandbox's
// (head, df, nproc...), which its user may replace: one that prints
// without end no longer has the daemon hold all it prints (it buffered
// the whole output, then copied it: a sandbox could run the daemon out
// of memory); the answer is the host's reading.
func TestMetricsHostileOutput(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t)
	var sb created
	if st, _ := rest(t, "POST", url+"/sandboxes", key, map[string]any{"templateID": "base", "timeout": 300}, &sb); st != http.StatusCreated {
		t.Fatalf("create: status %d", st)
	}
	const hostile = `p=$(command -v nproc) && printf '#!/bin/sh\nexec head -c 600000000 /dev/zero\n' > "$p"`
	if st, err := d.Client.Exec(t.Context(), sb.SandboxID, sdk.ExecRequest{Cmd: []string{"sh", "-c", hostile}}); err != nil || st.Code != 0 {
		t.Fatalf("replace nproc: %+v %v", st, err)
	}
	var ms []struct {
		MemTotal int64 `json:"memTotal"`
	}
	if st, _ := rest(t, "GET", url+"/sandboxes/"+sb.SandboxID+"/metrics", key, nil, &ms); st != http.StatusOK || len(ms) == 0 || ms[0].MemTotal == 0 {
		t.Fatalf("getMetrics with a hostile nproc: %d %+v", st, ms)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kib, _ := strconv.Atoi(f[1])
			if kib > 1<<20 {
				t.Fatalf("the daemon's peak memory went to %d MiB reading a sandbox's answer", kib>>10)
			}
			t.Logf("the daemon's peak memory: %d MiB", kib>>10)
		}
	}
}
