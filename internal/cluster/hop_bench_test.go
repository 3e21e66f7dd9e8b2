package cluster_test

import (
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/benchkit"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// BenchmarkExecHop runs `true` in a sandbox on n1 of a two-node cluster
// in network namespaces, directly through n1 (direct) and through n2,
// which proxies it to n1 (proxied): the difference of the two is the
// extra hop of a proxied exec. Each reports the CPU time n2 used per
// exec (n2-cpu-ms/op: in direct, n2's idle work alone; the difference is
// what proxying costs it).
//
//	go test ./internal/cluster/ -run '^$' -bench ExecHop -benchtime 200x
func BenchmarkExecHop(b *testing.B) {
	c := testenv.StartNetCluster(b, 2, nil, nil)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	sb, err := n1.Client.CreateSandbox(b.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		b.Fatal(err)
	}
	// `true`, and a command the agent does not find (exit 127, no
	// process started: the same hop without a spawn's milliseconds of
	// spread).
	exec := func(b *testing.B, cl *sdk.Client, cmd string, want int) {
		st, err := cl.Exec(b.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{cmd}})
		if err != nil || st.Code != want {
			b.Fatalf("exec %s: %+v %v, want exit %d", cmd, st, err, want)
		}
	}
	for _, bc := range []struct {
		name string
		via  *testenv.NetNode
		cmd  string
		want int
	}{{"direct", n1, "true", 0}, {"proxied", n2, "true", 0}, {"direct-nospawn", n1, benchkit.NoSuchCommand, 127}, {"proxied-nospawn", n2, benchkit.NoSuchCommand, 127}} {
		b.Run(bc.name, func(b *testing.B) {
			for range 5 { // warm the connections and the route
				exec(b, bc.via.Client, bc.cmd, bc.want)
			}
			cpu0 := threadsCPU(b, n2.Pid())
			for b.Loop() {
				exec(b, bc.via.Client, bc.cmd, bc.want)
			}
			b.ReportMetric(float64(threadsCPU(b, n2.Pid())-cpu0)/float64(time.Millisecond)/float64(b.N), "n2-cpu-ms/op")
		})
	}
}
