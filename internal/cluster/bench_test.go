package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

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

func p50(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// TestNetClusterCosts measures, on three nodes in namespaces, the extra
// hop of an exec proxied through a node that does not hold the sandbox
// (side by side with a direct one) and counts etcd writes per create and
// per exec; it holds the write targets (<= 2 per create, 0 per exec) and
// logs the figures for docs/benchmarks.md.
func TestNetClusterCosts(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, nil, nil)
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
	const rounds = 100
	var direct, proxied []time.Duration
	// The CPU the proxying daemon spends: the hop's cost whatever the
	// host's load does to its wall time.
	// What it spends idle (its lease and capacity refreshes, once a
	// second) is measured over a window first and taken off.
	const idleWindow = 5 * time.Second
	idle0 := procCPU(t, n2.Pid())
	select {
	case <-time.After(idleWindow): // a measurement window, not a wait for an event
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
	idleRate := float64(procCPU(t, n2.Pid())-idle0) / float64(idleWindow)
	cpu0, loop0 := procCPU(t, n2.Pid()), time.Now()
	for range rounds {
		direct = append(direct, exec(n1.Client))
		proxied = append(proxied, exec(n2.Client))
	}
	cpu := procCPU(t, n2.Pid()) - cpu0
	idle := time.Duration(idleRate * float64(time.Since(loop0)))
	t.Logf("the proxying daemon (n2) used %s of CPU over the %d rounds, %s of it idle work (%.1f ms/s measured idle): %s per proxied exec",
		cpu, rounds, idle.Round(time.Millisecond), idleRate*1000, ((cpu - idle) / rounds).Round(10*time.Microsecond))
	w.settle()
	execWrites := len(w.of(execKey)) - atCreate
	d, p := p50(direct), p50(proxied)
	t.Logf("exec p50 over %d side by side: direct (n1 holds it) %s, proxied through n2 %s: extra hop %s", rounds, d, p, p-d)
	t.Logf("etcd writes: %d for %d execs (the sandbox's record: %d writes by its create)", execWrites, 2*rounds+10, atCreate)
	if atCreate != 1 {
		t.Errorf("%d etcd writes for an unnamed create, want 1", atCreate)
	}
	if execWrites != 0 {
		t.Errorf("%d etcd writes of the sandbox's record during its execs, want 0", execWrites)
	}
}

// procCPU is the user and system CPU time process pid has used.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// After the command's ")": state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz
}
