package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/internal/benchkit"
	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/sdk"
)

// clusterBenchConfig is `clade bench --cluster`: a running cluster reached
// through each node's API.
type clusterBenchConfig struct {
	// Nodes are the nodes' API addresses (http://HOST:PORT or sockets);
	// the first is "node 1", the one a single-node storm is pinned to and
	// the one that holds the exec case's sandbox; the second proxies.
	Nodes []string
	// Etcd, when set (etcd://HOST:2379), is watched to count the
	// directory's writes per create and per exec.
	Etcd string
	// Storm is how many creates each storm makes, all at once.
	Storm int
	// Samples is the exec case's rounds (each one direct, one proxied).
	Samples int
	// EtcdWriteRate is the etcd write rate the projection assumes
	// (writes/s a 3-member etcd on SSDs sustains), not measured here.
	EtcdWriteRate float64
	Image         string
	Cases         []string
	// Fork is how many children each fork of the fork case makes.
	Fork int
	// Rounds is how many times the fork and wake cases do each of their
	// two kinds, side by side.
	Rounds int
	// MemoryMiB is the memory limit of the fork and wake cases' sandbox,
	// which holds HoldMiB of it in a file in memory (/dev/shm).
	MemoryMiB, HoldMiB int
}

// clusterCase is one measurement of the cluster bench.
type clusterCase struct {
	name string
	run  func(b *clusterBench, ctx context.Context) error
}

var clusterCases = []clusterCase{
	{"storm", (*clusterBench).storm},
	{"exec", (*clusterBench).execHop},
	{"fork", (*clusterBench).forkAcross},
	{"wake", (*clusterBench).wakeAcross},
}

type clusterBench struct {
	cfg    clusterBenchConfig
	nodes  []*sdk.Client
	names  []string // the nodes' names, as nodes[i] calls itself
	writes *etcdWrites
	out    io.Writer

	// Figures the projection uses.
	oneNodeRate, clusterRate float64 // creates per second in the storms
	createWrites, execWrites float64 // etcd writes per create, per exec
	childWrites              float64 // etcd writes per fork child
	hop                      time.Duration
}

func runClusterBench(ctx context.Context, cfg clusterBenchConfig, out io.Writer) error {
	if len(cfg.Nodes) < 2 {
		return badArg("--cluster needs --nodes with two or more node API addresses (http://HOST:PORT,...): the first holds the exec case's sandbox, the second proxies")
	}
	for _, c := range cfg.Cases {
		if !slices.ContainsFunc(clusterCases, func(k clusterCase) bool { return k.name == c }) {
			return badArg("unknown --cluster-cases %q: give %s", c, strings.Join(clusterCaseNames(), ","))
		}
	}
	b := &clusterBench{cfg: cfg, out: out}
	for _, addr := range cfg.Nodes {
		c, err := sdk.New(addr)
		if err != nil {
			return badArg("--nodes %q: %v", addr, err)
		}
		ns, err := c.ListNodes(ctx)
		if err != nil {
			return fmt.Errorf("node %s: %w", addr, err)
		}
		self := ""
		for _, n := range ns {
			if n.Self {
				self = n.Name
			}
		}
		if self == "" {
			return fmt.Errorf("node %s does not name itself in its node list", addr)
		}
		if i := slices.Index(b.names, self); i >= 0 {
			// The cases would measure the node against itself, as if
			// another ("through another node", "on another node").
			return badArg("--nodes names node %s twice (%s and %s): give each node's address once", self, cfg.Nodes[i], addr)
		}
		b.nodes, b.names = append(b.nodes, c), append(b.names, self)
	}
	if cfg.Etcd != "" {
		eps, err := cluster.ParseEndpoints(cfg.Etcd)
		if err != nil {
			return badArg("%v", err)
		}
		cli, err := cluster.Dial(ctx, eps, 10*time.Second)
		if err != nil {
			return err
		}
		defer cli.Close()
		w, err := watchWrites(ctx, cli)
		if err != nil {
			return err
		}
		b.writes = w
	}
	fmt.Fprintf(out, "cluster of %d nodes (%s), bench through %s\n", len(b.names), strings.Join(b.names, ", "), strings.Join(cfg.Nodes, ", "))
	var errs []error
	for _, k := range clusterCases {
		if len(cfg.Cases) > 0 && !slices.Contains(cfg.Cases, k.name) {
			continue
		}
		if err := k.run(b, ctx); err != nil {
			fmt.Fprintf(out, "%s: FAILED: %v\n", k.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", k.name, err))
		}
	}
	b.project()
	if len(errs) > 0 {
		return exitError{1}
	}
	return nil
}

func clusterCaseNames() []string {
	var ns []string
	for _, k := range clusterCases {
		ns = append(ns, k.name)
	}
	return ns
}

// storm makes Storm sandboxes at once pinned to node 1, then Storm at
// once placed by the cluster (spread over the entry nodes), and removes
// them: the wall time of each storm, the creates' p50 and p95, where they
// went, and the etcd writes per create.
func (b *clusterBench) storm(ctx context.Context) error {
	type res struct {
		ids   []string
		lat   []float64
		wall  time.Duration
		nodes map[string]int
	}
	run := func(pin bool) (res, error) {
		r := res{nodes: map[string]int{}}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var errs []error
		start := time.Now()
		for i := range b.cfg.Storm {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, req := b.nodes[i%len(b.nodes)], sdk.CreateSandboxRequest{Image: b.cfg.Image}
				if pin {
					c, req.Node = b.nodes[0], b.names[0]
				}
				t0 := time.Now()
				sb, err := c.CreateSandbox(ctx, req)
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				r.ids = append(r.ids, sb.ID)
				r.lat = append(r.lat, float64(d.Microseconds())/1000)
				r.nodes[sb.Node]++
			}()
		}
		wg.Wait()
		r.wall = time.Since(start)
		return r, errors.Join(errs...)
	}
	cleanup := func(ids []string) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		for _, id := range ids {
			_ = b.nodes[0].DeleteSandbox(cctx, id)
		}
	}
	tw := tabwriter.NewWriter(b.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "storm of %d creates at once\twall\tcreates/s\tp50 ms\tp95 ms\tnodes\n", b.cfg.Storm)
	for _, pin := range []bool{true, false} {
		var rev0 int64
		if b.writes != nil {
			rev0 = b.writes.count()
		}
		r, err := run(pin)
		cleanup(r.ids)
		if err != nil {
			return err
		}
		slices.Sort(r.lat)
		rate := float64(len(r.ids)) / r.wall.Seconds()
		what := "on one node (" + b.names[0] + ")"
		if pin {
			b.oneNodeRate = rate
		} else {
			what = fmt.Sprintf("across the cluster (through %d nodes)", len(b.nodes))
			b.clusterRate = rate
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.0f\t%.0f\t%s\n", what, r.wall.Round(time.Millisecond), rate,
			benchkit.Percentile(r.lat, 0.5), benchkit.Percentile(r.lat, 0.95), nodeCounts(r.nodes))
		if b.writes != nil && pin {
			b.writes.settle()
			// The storm's creates and removes: half are the creates'.
			b.createWrites = float64(b.writes.count()-rev0) / float64(2*len(r.ids))
		}
	}
	if b.writes != nil {
		fmt.Fprintf(tw, "etcd writes per create (and per remove)\t%.2f\t\t\t\t\n", b.createWrites)
	}
	return tw.Flush()
}

// execHop runs `true` in a sandbox on node 1, alternately through node 1
// (direct) and node 2 (proxied): the p50 of each, the extra hop, and
// etcd's writes per exec. Then the same with a command the agent does not
// find (exit 127, no process started): the same hop at ~1 ms a call with
// little spread, where a spawn in gVisor swings by milliseconds, so its
// difference is the hop's figure (a `true`'s p50 difference is noise at
// the scale of the target).
func (b *clusterBench) execHop(ctx context.Context) error {
	sb, err := b.nodes[0].CreateSandbox(ctx, sdk.CreateSandboxRequest{Image: b.cfg.Image, Node: b.names[0]})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = b.nodes[0].DeleteSandbox(cctx, sb.ID)
	}()
	exec := func(c *sdk.Client, cmd string, want int) (float64, error) {
		t0 := time.Now()
		st, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{cmd}})
		if err == nil && st.Code != want {
			err = fmt.Errorf("exec %s exited %d, want %d: %s", cmd, st.Code, want, st.Error)
		}
		return float64(time.Since(t0).Microseconds()) / 1000, err
	}
	for range 5 { // both paths' connections and route caches
		if _, err := exec(b.nodes[0], "true", 0); err != nil {
			return err
		}
		if _, err := exec(b.nodes[1], "true", 0); err != nil {
			return err
		}
	}
	var rev0 int64
	if b.writes != nil {
		b.writes.settle()
		rev0 = b.writes.count()
	}
	series := func(cmd string, want, rounds int) (direct, proxied []float64, err error) {
		for range rounds {
			d, err := exec(b.nodes[0], cmd, want)
			if err != nil {
				return nil, nil, err
			}
			p, err := exec(b.nodes[1], cmd, want)
			if err != nil {
				return nil, nil, err
			}
			direct, proxied = append(direct, d), append(proxied, p)
		}
		slices.Sort(direct)
		slices.Sort(proxied)
		return direct, proxied, nil
	}
	direct, proxied, err := series("true", 0, b.cfg.Samples)
	if err != nil {
		return err
	}
	nsRounds := 5 * b.cfg.Samples
	nsDirect, nsProxied, err := series(benchkit.NoSuchCommand, 127, nsRounds)
	if err != nil {
		return err
	}
	dp, pp := benchkit.Percentile(direct, 0.5), benchkit.Percentile(proxied, 0.5)
	ndp, npp := benchkit.Percentile(nsDirect, 0.5), benchkit.Percentile(nsProxied, 0.5)
	b.hop = time.Duration((npp - ndp) * float64(time.Millisecond))
	tw := tabwriter.NewWriter(b.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "exec, rounds side by side\tp50 ms\tp95 ms\n")
	fmt.Fprintf(tw, "`true` direct (through %s, which holds it), %d rounds\t%.2f\t%.2f\n", b.names[0], b.cfg.Samples, dp, benchkit.Percentile(direct, 0.95))
	fmt.Fprintf(tw, "`true` proxied (through %s)\t%.2f\t%.2f\n", b.names[1], pp, benchkit.Percentile(proxied, 0.95))
	fmt.Fprintf(tw, "`true`: p50 difference (a spawn's noise)\t%.2f\t\n", pp-dp)
	fmt.Fprintf(tw, "no spawn direct, %d rounds\t%.2f\t%.2f\n", nsRounds, ndp, benchkit.Percentile(nsDirect, 0.95))
	fmt.Fprintf(tw, "no spawn proxied\t%.2f\t%.2f\n", npp, benchkit.Percentile(nsProxied, 0.95))
	fmt.Fprintf(tw, "extra hop (no spawn, p50 difference)\t%.2f\t\n", npp-ndp)
	if b.writes != nil {
		b.writes.settle()
		b.execWrites = float64(b.writes.count()-rev0) / float64(2*(b.cfg.Samples+nsRounds))
		fmt.Fprintf(tw, "etcd writes per exec\t%.2f\t\n", b.execWrites)
	}
	return tw.Flush()
}

// project writes what the figures mean for N nodes on machines of their
// own: this bench's nodes share one host, so they show costs, not scale.
func (b *clusterBench) project() {
	if b.oneNodeRate == 0 && b.hop == 0 && b.childWrites == 0 {
		return
	}
	fmt.Fprintf(b.out, "\nprojection for N nodes on machines of their own (the nodes measured here share one host):\n")
	if b.oneNodeRate > 0 {
		w := b.createWrites
		if w == 0 {
			w = 1 // the directory's one write per unnamed create (docs/cluster.md), when etcd was not watched
		}
		etcdCap := b.cfg.EtcdWriteRate / (2 * w) // a create and its remove
		fmt.Fprintf(b.out, "  creates: each node creates at its own rate (%.2f/s measured on one node here); the cluster adds %.1f etcd write(s) per create\n", b.oneNodeRate, w)
		fmt.Fprintf(b.out, "  and one per remove, so etcd (assumed %.0f writes/s, --etcd-write-rate) caps create+remove churn at ~%.0f/s:\n", b.cfg.EtcdWriteRate, etcdCap)
		for _, n := range []int{3, 10, 30, 100} {
			fmt.Fprintf(b.out, "    N=%-3d ~%.1f creates/s\n", n, min(float64(n)*b.oneNodeRate, etcdCap))
		}
	}
	if b.childWrites > 0 {
		fmt.Fprintf(b.out, "  forks: each fork child costs %.1f etcd write(s) (its record), so etcd (as assumed) caps fork churn at ~%.0f children/s across the cluster.\n",
			b.childWrites, b.cfg.EtcdWriteRate/(b.childWrites+1))
	}
	if b.hop != 0 {
		fmt.Fprintf(b.out, "  calls on a sandbox through a node that does not hold it (a client that picks nodes at random: (N-1)/N of them)\n")
		fmt.Fprintf(b.out, "  pay the extra hop (%s p50 here), with no etcd read while the route is cached (2 s) and %.1f etcd writes per exec.\n",
			b.hop.Round(10*time.Microsecond), b.execWrites)
	}
}

// etcdWrites counts write revisions of the directory's keys by a watch.
type etcdWrites struct {
	mu   sync.Mutex
	revs map[int64]bool
	last time.Time
}

func watchWrites(ctx context.Context, cli *clientv3.Client) (*etcdWrites, error) {
	w := &etcdWrites{revs: map[int64]bool{}}
	r, err := cli.Get(ctx, "/clade/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	ch := cli.Watch(clientv3.WithRequireLeader(ctx), "/clade/", clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
	go func() {
		for resp := range ch {
			w.mu.Lock()
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if strings.HasPrefix(k, "/clade/sandboxes/") || strings.HasPrefix(k, "/clade/names/") {
					w.revs[ev.Kv.ModRevision] = true
				}
			}
			w.last = time.Now()
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func (w *etcdWrites) count() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(len(w.revs))
}

// settle waits until the watch has been quiet for a second (the writes of
// what just answered have arrived), at most 10 s.
func (w *etcdWrites) settle() {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		w.mu.Lock()
		quiet := time.Since(w.last) > time.Second
		w.mu.Unlock()
		if quiet {
			return
		}
		time.Sleep(200 * time.Millisecond) // polling the watch's last event
	}
}
