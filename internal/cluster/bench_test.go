package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/clade-sandbox/clade/internal/benchkit"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// writeCounter counts etcd's write transactions (revisions) on the
// directory's keys (sandboxes/ and names/), by watching them, per key: a
// sandbox's writes are told apart from others' whatever their timing.
type writeCounter struct {
	mu   sync.Mutex
	revs map[string]map[int64]bool // by key
	last time.Time
}

func countWrites(t *testing.T, endpoint string) *writeCounter {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cli.Close() })
	w := &writeCounter{revs: map[string]map[int64]bool{}}
	for _, p := range []string{"/clade/sandboxes/", "/clade/names/"} {
		ch := cli.Watch(clientv3.WithRequireLeader(ctx), p, clientv3.WithPrefix())
		go func() {
			for r := range ch {
				w.mu.Lock()
				for _, ev := range r.Events {
					k := string(ev.Kv.Key)
					if w.revs[k] == nil {
						w.revs[k] = map[int64]bool{}
					}
					w.revs[k][ev.Kv.ModRevision] = true
				}
				w.last = time.Now()
				w.mu.Unlock()
			}
		}()
	}
	// The watches are up once they see a write: the test's own.
	if _, err := cli.Put(ctx, "/clade/names/.bench-probe", "x"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the watch sees the probe", func() (bool, string) {
		return len(w.of("/clade/names/.bench-probe")) == 1, ""
	})
	return w
}

// of is the revisions that wrote any of keys (a transaction writing two
// of them is one).
func (w *writeCounter) of(keys ...string) map[int64]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[int64]bool{}
	for _, k := range keys {
		for r := range w.revs[k] {
			out[r] = true
		}
	}
	return out
}

// settle waits until no write came for 3 s: the nodes write records as
// their events arrive, after the calls answered.
func (w *writeCounter) settle() {
	for {
		w.mu.Lock()
		quiet := time.Since(w.last) > 3*time.Second
		w.mu.Unlock()
		if quiet {
			return
		}
		time.Sleep(100 * time.Millisecond) // polling for the writes to settle
	}
}

func p50(ds []time.Duration) time.Duration { return pct(ds, 50) }

// pct is the q-th percentile of ds (sorted in place).
func pct(ds []time.Duration, q int) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)*q/100, len(ds)-1)]
}

// TestNetClusterCosts measures, on three nodes in namespaces, the extra
// hop of an exec proxied through a node that does not hold the sandbox
// (side by side with a direct one) and counts etcd writes per create and
// per exec; it holds the write targets (<= 2 per create, 0 per exec) and
// logs the figures for docs/benchmarks.md.
//
// With CLADE_HOP_PROFILE=FILE, n2 serves --pprof on its loopback and,
// after the measured rounds, a 15 s CPU profile of it is written to FILE
// while a loop of proxied execs runs through it (go tool pprof FILE).
func TestNetClusterCosts(t *testing.T) {
	profile := os.Getenv("CLADE_HOP_PROFILE")
	c := testenv.StartNetCluster(t, 3, nil, func(i int) []string {
		if i == 1 && profile != "" {
			return []string{"--pprof", "127.0.0.1:6060"}
		}
		return nil
	})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	w := countWrites(t, n1.Etcd)

	const creates = 6
	var keys [][]string
	for i := range creates {
		req := sdk.CreateSandboxRequest{}
		if i%2 == 1 {
			req.Name = fmt.Sprintf("w%d", i)
		}
		sb, err := n2.Client.CreateSandbox(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		k := []string{"/clade/sandboxes/" + sb.ID}
		if req.Name != "" {
			k = append(k, "/clade/names/"+req.Name)
		}
		keys = append(keys, k)
	}

	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	// Every create's record is written before the execs are counted: a
	// loaded host once delayed one past settle's 3 quiet seconds (the
	// create answers once its record is written, but the watch that counts
	// it may lag, and a write etcd refused in time is redone from the
	// create's event).
	for _, k := range append(keys, []string{"/clade/sandboxes/" + sb.ID}) {
		waitFor(t, 60*time.Second, "the record of "+k[0]+" written", func() (bool, string) { return len(w.of(k...)) > 0, "" })
	}
	w.settle()
	createWrites := 0
	for _, k := range keys {
		n := len(w.of(k...))
		createWrites += n
		if n > 2 {
			t.Errorf("%d etcd writes for the create of %v, want <= 2", n, k)
		}
	}
	t.Logf("etcd writes: %d for %d creates through n2 (half named): %.2f per create", createWrites, creates, float64(createWrites)/creates)
	execKey := "/clade/sandboxes/" + sb.ID
	atCreate := len(w.of(execKey))
	exec := func(cl *sdk.Client) time.Duration {
		start := time.Now()
		st, err := cl.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %+v %v", st, err)
		}
		return time.Since(start)
	}
	for range 5 { // warm both paths (connections, the remote client)
		exec(n1.Client)
		exec(n2.Client)
	}
	const rounds = 200
	var direct, proxied []time.Duration
	// The CPU the proxying daemon spends: the hop's cost whatever the
	// host's load does to its wall time. n2's CPU time (its threads' run
	// time, to the nanosecond) is read around each exec: over the direct
	// ones it is n2's idle work alone (its lease and capacity refreshes,
	// its etcd member), over the proxied ones that and the hop, so the
	// difference of the two sums is the hop's.
	var cpuDirect, cpuProxied time.Duration
	timed := func(cl *sdk.Client, sum *time.Duration) time.Duration {
		c0 := threadsCPU(t, n2.Pid())
		d := exec(cl)
		*sum += threadsCPU(t, n2.Pid()) - c0
		return d
	}
	for range rounds {
		direct = append(direct, timed(n1.Client, &cpuDirect))
		proxied = append(proxied, timed(n2.Client, &cpuProxied))
	}
	t.Logf("the proxying daemon (n2) used %s of CPU over the %d proxied execs and %s over the %d direct ones (its idle work): %s per proxied exec",
		cpuProxied.Round(time.Millisecond), rounds, cpuDirect.Round(time.Millisecond), rounds, ((cpuProxied - cpuDirect) / rounds).Round(10*time.Microsecond))
	w.settle()
	execWrites := len(w.of(execKey)) - atCreate
	d, p := p50(direct), p50(proxied)
	t.Logf("exec p50 over %d side by side: direct (n1 holds it) %s, proxied through n2 %s: extra hop %s", rounds, d, p, p-d)
	d90, p90 := pct(direct, 90), pct(proxied, 90)
	t.Logf("exec p90: direct %s, proxied %s: %s", d90, p90, p90-d90)
	// The hop is the same whatever the command does, but a spawn in
	// gVisor swings by milliseconds (p90 ~1.5x p50 on a quiet host), so
	// a p50 difference of 200 `true`s cannot resolve a tenth of one. A
	// command the agent does not find (exit 127 after its PATH search, no
	// process started) goes through the same hop, both nodes' HTTP and the
	// holder's agent, at ~1 ms with little spread: the hop's figure.
	noSpawn := func(cl *sdk.Client) time.Duration {
		start := time.Now()
		st, err := cl.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{benchkit.NoSuchCommand}})
		if err != nil || st.Code != 127 {
			t.Fatalf("exec of a missing command: %+v %v, want exit 127", st, err)
		}
		return time.Since(start)
	}
	const nsRounds = 1000
	var nsDirect, nsProxied, nsDiff []time.Duration
	for range nsRounds {
		a, b := noSpawn(n1.Client), noSpawn(n2.Client)
		nsDirect, nsProxied, nsDiff = append(nsDirect, a), append(nsProxied, b), append(nsDiff, b-a)
	}
	nd, np := p50(nsDirect), p50(nsProxied)
	t.Logf("exec without a spawn, p50 over %d side by side: direct %s, proxied %s: extra hop %s (median of the rounds' differences %s; p90 %s / %s)",
		nsRounds, nd, np, np-nd, p50(nsDiff), pct(nsDirect, 90), pct(nsProxied, 90))
	t.Logf("etcd writes: %d for %d execs (the sandbox's record: %d writes by its create)", execWrites, 2*rounds+10, atCreate)
	if atCreate != 1 {
		t.Errorf("%d etcd writes for an unnamed create, want 1", atCreate)
	}
	if execWrites != 0 {
		t.Errorf("%d etcd writes of the sandbox's record during its execs, want 0", execWrites)
	}
	if profile != "" {
		profileProxying(t, n2.NS, profile, func() { exec(n2.Client) })
	}
}

// profileProxying writes a 15 s CPU profile of the daemon serving
// --pprof on 127.0.0.1:6060 in network namespace ns to file, while call
// runs in a loop.
func profileProxying(t *testing.T, ns, file string, call func()) {
	t.Helper()
	cmd := osexec.Command("nsenter", "--net="+ns, "curl", "-sS", "--fail", "-o", file, "http://127.0.0.1:6060/debug/pprof/profile?seconds=15")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	n := 0
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("profile: %v\n%s", err, out.String())
			}
			t.Logf("CPU profile of n2 over %d proxied execs written to %s", n, file)
			return
		default:
		}
		call()
		n++
	}
}

// threadsCPU is the time process pid's threads have run, to the
// nanosecond (the sum of /proc/PID/task/*/schedstat's first field; a
// thread that ended meanwhile is left out).
func threadsCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/task/%s/schedstat: %q", pid, task.Name(), b)
		}
		sum += time.Duration(ns)
	}
	return sum
}
