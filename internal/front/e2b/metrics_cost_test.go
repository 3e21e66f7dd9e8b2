package e2b_test

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procCPU returns the CPU time process pid spent, its own and that of its
// children it waited for (the runsc processes it ran and reaped).
func procCPU(t testing.TB, pid int) (self, children time.Duration) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's closing parenthesis: utime is the 14th
	// field of the line, stime, cutime and cstime follow.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	tick := func(i int) time.Duration {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Second / 100 // USER_HZ
	}
	return tick(11) + tick(12), tick(13) + tick(14)
}

// BenchmarkMetricsRing measures what the E2B front's metrics sampling
// (every 5 s, each sandbox an E2B client made, through the service's
// Stats) costs the host in CPU with 20 such sandboxes: the daemon's own
// CPU and that of the processes it ran (on gVisor, a `runsc ps` per
// sandbox and sample) over 30 s, per second. The figures are in
// docs/benchmarks.md.
func BenchmarkMetricsRing(b *testing.B) {
	d, url, key := startE2B(b)
	const n = 20
	ids := make([]string, 0, n)
	for range n {
		var sb created
		if st, _ := rest(b, "POST", url+"/sandboxes", key, map[string]any{"templateID": "base", "timeout": 600}, &sb); st != http.StatusCreated {
			b.Fatalf("create: %d", st)
		}
		ids = append(ids, sb.SandboxID)
	}
	b.Cleanup(func() {
		for _, id := range ids {
			d.Client.DeleteSandbox(context.Background(), id)
		}
	})
	const window = 30 * time.Second
	for b.Loop() {
		self0, kids0 := procCPU(b, d.Pid())
		time.Sleep(window) // measuring CPU over a window of time, not ordering
		self1, kids1 := procCPU(b, d.Pid())
		per := func(d time.Duration) float64 { return float64(d.Milliseconds()) / window.Seconds() }
		b.ReportMetric(per(self1-self0), "daemon-cpu-ms/s")
		b.ReportMetric(per(kids1-kids0), "children-cpu-ms/s")
	}
	b.ReportMetric(0, "ns/op")
}
