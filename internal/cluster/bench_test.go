package cluster_test

import (
	"context"
	"fmt"
	"slices"
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
// directory's keys (sandboxes/ and names/), by watching them.
type writeCounter struct {
	mu   sync.Mutex
	revs map[int64]bool
	last time.Time
	log  []string
}

func countWrites(t *testing.T, endpoint string) *writeCounter {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cli.Close() })
	w := &writeCounter{revs: map[int64]bool{}}
	for _, p := range []string{"/clade/sandboxes/", "/clade/names/"} {
		ch := cli.Watch(clientv3.WithRequireLeader(ctx), p, clientv3.WithPrefix())
		go func() {
			for r := range ch {
				w.mu.Lock()
				for _, ev := range r.Events {
					w.revs[ev.Kv.ModRevision] = true
					w.log = append(w.log, fmt.Sprintf("%d %s %s %s", ev.Kv.ModRevision, ev.Type, ev.Kv.Key, ev.Kv.Value))
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
	if _, err := cli.Delete(ctx, "/clade/names/.bench-probe"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the watch sees the probe", func() (bool, string) { n := w.take(); return n >= 2, fmt.Sprint(n) })
	return w
}

// take waits until no write came for 3 s (the nodes write their
// records as their events arrive, after the call answered) and returns
// the writes since the last take.
func (w *writeCounter) take() int {
	for {
		w.mu.Lock()
		quiet := time.Since(w.last) > 3*time.Second
		n := len(w.revs)
		if quiet {
			w.revs = map[int64]bool{}
		}
		w.mu.Unlock()
		if quiet {
			return n
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
	var ids []string
	for i := range creates {
		req := sdk.CreateSandboxRequest{}
		if i%2 == 1 {
			req.Name = fmt.Sprintf("w%d", i)
		}
		sb, err := n2.Client.CreateSandbox(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	createWrites := w.take()
	t.Logf("etcd writes: %d for %d creates through n2 (half named): %.2f per create", createWrites, creates, float64(createWrites)/creates)
	if createWrites > 2*creates {
		t.Errorf("%d etcd writes for %d creates: more than 2 per create:\n%s", createWrites, creates, strings.Join(w.log, "\n"))
	}

	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if n := w.take(); n > 1 {
		t.Errorf("%d etcd writes for a create on n1, want 1", n)
	}
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
	for range rounds {
		direct = append(direct, exec(n1.Client))
		proxied = append(proxied, exec(n2.Client))
	}
	execWrites := w.take()
	d, p := p50(direct), p50(proxied)
	t.Logf("exec p50 over %d side by side: direct (n1 holds it) %s, proxied through n2 %s: extra hop %s", rounds, d, p, p-d)
	t.Logf("etcd writes: %d for %d execs", execWrites, 2*rounds+10)
	if execWrites != 0 {
		var mine []string
		for _, l := range w.log {
			if strings.Contains(l, sb.ID) {
				mine = append(mine, l)
			}
		}
		t.Errorf("%d etcd writes for execs, want 0; the sandbox's writes:\n%s", execWrites, strings.Join(mine, "\n"))
	}
}
