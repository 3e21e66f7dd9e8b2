package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/internal/benchkit"
	"github.com/clade-sandbox/clade/sdk"
)

func newBenchCmd() *cobra.Command {
	cmd := verb("bench [flags]", "Measures clade on this host: latency percentiles of create, exec, snapshot, fork and\n"+
		"wake, host memory per forked child, and how many idle sandboxes fit. With --baseline\n"+
		"the same work is also done with plain runsc commands, interleaved, and the table shows\n"+
		"clade/runsc ratios. The network phases compare clade with itself, side by side:\n"+
		"netcreate (create with a network vs without), proxy (a request and a download through\n"+
		"the ingress, or the API's port-forward on a daemon without one, vs straight to the\n"+
		"sandbox's address), proxywake (a request to a slept app until its answer) and masswake\n"+
		"(N slept apps woken by one request each at once). They need a daemon with networking.\n"+
		"Removes everything it made, also on Ctrl-C. Exits 1 if a phase failed.")
	cmd.Short, cmd.Args = "Measure clade on this host (optionally against plain runsc)", nargs(0, 0)
	cmd.Example = "  clade bench --phases create,exec --samples 10\n  clade bench --baseline --json bench.json\n  clade bench --phases fork --fanout 1,16\n" +
		"  CLADE_TOKEN=... clade bench --cluster --nodes http://10.0.0.11:7070,http://10.0.0.12:7070,http://10.0.0.13:7070 --etcd etcd://10.0.0.11:2379"
	fs := cmd.Flags()
	cfg := benchkit.DefaultConfig()
	phases := fs.String("phases", strings.Join(cfg.Phases, ","), "phases to run, in order")
	fanout := fs.String("fanout", joinInts(cfg.Fanout), "fork widths")
	fs.IntVar(&cfg.Samples, "samples", cfg.Samples, "measured samples per latency series")
	fs.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "discarded samples before them")
	fs.IntVar(&cfg.Density, "density", cfg.Density, "idle sandboxes the density phase aims for")
	fs.StringVar(&cfg.Image, "image", "", "image of every sandbox (default: the daemon's default)")
	fs.StringVar(&cfg.Engine, "engine", "", "engine of every sandbox: gvisor or qemu (default: the daemon's)")
	fs.IntVar(&cfg.MemoryMiB, "memory", 0, "memory limit in MiB of every sandbox but density's (default: the daemon's);\nthe daemon admits a fork of N only if N times this fits in free memory")
	fs.IntVar(&cfg.DensityMemoryMiB, "density-memory", cfg.DensityMemoryMiB, "memory limit in MiB of the density phase's idle sandboxes")
	fs.IntVar(&cfg.MemforkChildren, "memfork-children", 0, "children of the memfork phase (default: the largest --fanout <= 16)")
	fs.IntVar(&cfg.ProxyMiB, "proxy-mib", cfg.ProxyMiB, "size in MiB of the proxy phase's download")
	fs.IntVar(&cfg.MassWake, "masswake", cfg.MassWake, "slept apps the masswake phase wakes at once")
	fs.IntVar(&cfg.MassWakeMemoryMiB, "masswake-memory", cfg.MassWakeMemoryMiB, "memory limit in MiB of the masswake phase's apps")
	fs.StringVar(&cfg.EncryptedHost, "encrypted-host", "", "socket (or URL) of a second daemon started with --encrypt-at-rest: the atrest\nphase (not in the default --phases) compares it with this one side by side")
	fs.BoolVar(&cfg.Baseline, "baseline", false, "also do the work with plain runsc commands and report clade/runsc ratios")
	fs.StringVar(&cfg.Runsc, "runsc", "", "runsc for the baseline (default: runsc next to clade, then $PATH)")
	fs.StringVar(&cfg.RootFS, "rootfs", cfg.RootFS, "rootfs dir the baseline boots (match it to --image)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "the daemon's data dir: the env block reports its filesystem,\n--settle watches the processes that mention it")
	settle := fs.Duration("settle", time.Duration(cfg.SettleMS)*time.Millisecond, "before each sample, wait up to this long for the daemon's background work\n(warm pool refill) to finish; 0 disables")
	jsonPath := fs.String("json", "", "also write the full result as JSON to `FILE`")
	ccfg := clusterBenchConfig{Storm: 12, Samples: 100, EtcdWriteRate: 1000, Fork: 6, Rounds: 3, MemoryMiB: 256, HoldMiB: 64}
	clusterMode := fs.Bool("cluster", false, "measure a running cluster instead (the other phases' flags do not apply): a storm of creates at once pinned to\n"+
		"one node vs placed across the nodes, a proxied exec's extra hop (direct vs through another node, side by side),\n"+
		"a fork on one node vs spread across the nodes, a wake on the node that slept the sandbox vs on another (needs the\n"+
		"nodes' --object-store), etcd writes per create, per exec and per fork child (with --etcd), and a projection for\n"+
		"N nodes; needs --nodes, the token in $CLADE_TOKEN")
	nodes := fs.String("nodes", "", "with --cluster: the nodes' API `addresses`, http://HOST:PORT,... (the first holds the exec case's sandbox, the second proxies)")
	fs.StringVar(&ccfg.Etcd, "etcd", "", "with --cluster: etcd://HOST:2379 of the cluster's etcd (plain http), watched to count the directory's writes")
	fs.IntVar(&ccfg.Storm, "storm", ccfg.Storm, "with --cluster: creates each storm makes at once")
	fs.Float64Var(&ccfg.EtcdWriteRate, "etcd-write-rate", ccfg.EtcdWriteRate, "with --cluster: the etcd write rate (writes/s) the projection assumes; not measured")
	fs.IntVar(&ccfg.Fork, "cluster-fork", ccfg.Fork, "with --cluster: children of each fork of the fork case")
	fs.IntVar(&ccfg.Rounds, "cluster-rounds", ccfg.Rounds, "with --cluster: rounds of each kind in the fork and wake cases, alternated")
	fs.IntVar(&ccfg.HoldMiB, "cluster-hold", ccfg.HoldMiB, "with --cluster: MiB the fork and wake cases' sandbox holds in memory (its limit: --memory, default 256)")
	cases := fs.String("cluster-cases", strings.Join(clusterCaseNames(), ","), "with --cluster: the cases to run")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if *clusterMode {
			ccfg.Nodes, ccfg.Cases, ccfg.Image = splitList(*nodes), splitList(*cases), cfg.Image
			if cmd.Flags().Changed("samples") {
				ccfg.Samples = cfg.Samples
			}
			if cfg.MemoryMiB > 0 {
				ccfg.MemoryMiB = cfg.MemoryMiB
			}
			if ccfg.Storm < 1 || ccfg.Samples < 1 || !(ccfg.EtcdWriteRate > 0) || ccfg.Fork < 1 || ccfg.Rounds < 1 {
				return badArg("--storm, --samples, --etcd-write-rate, --cluster-fork and --cluster-rounds must be positive")
			}
			if ccfg.HoldMiB < 0 || ccfg.HoldMiB >= ccfg.MemoryMiB {
				return badArg("--cluster-hold %d: give MiB under the sandbox's memory limit (%d MiB, --memory)", ccfg.HoldMiB, ccfg.MemoryMiB)
			}
			return runClusterBench(ctx, ccfg, os.Stdout)
		}
		for _, f := range []string{"nodes", "etcd", "storm", "etcd-write-rate", "cluster-cases", "cluster-fork", "cluster-rounds", "cluster-hold"} {
			if cmd.Flags().Changed(f) {
				return badArg("--%s needs --cluster", f)
			}
		}
		return runBench(ctx, c, &cfg, phases, fanout, settle, jsonPath)
	})
	return cmd
}

func runBench(ctx context.Context, c *sdk.Client, cfg *benchkit.Config, phases, fanout *string, settle *time.Duration, jsonPath *string) error {
	cfg.Phases = splitList(*phases)
	cfg.SettleMS = int(settle.Milliseconds())
	var err error
	if cfg.Fanout, err = parseInts(*fanout); err != nil {
		fmt.Fprintf(os.Stderr, "clade bench: --fanout: %v\n", err)
		return errUsage
	}
	if cfg.Baseline && cfg.Runsc == "" {
		cfg.Runsc = findRunsc()
	}
	cfg.CladeVersion = versionString()
	cfg.CommandLine = os.Args
	fi, _ := os.Stderr.Stat()
	cfg.Progress = benchkit.NewProgress(os.Stderr, fi != nil && fi.Mode()&os.ModeCharDevice != 0)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "clade bench: %v\n", err)
		return errUsage
	}

	res, err := benchkit.Run(ctx, c, *cfg)
	if err != nil {
		return err
	}
	if err := benchkit.WriteTable(os.Stdout, res); err != nil {
		return err
	}
	if *jsonPath != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if res.Failed() {
		return exitError{1}
	}
	return nil
}

// findRunsc prefers the runsc installed beside clade (what `make deps`
// builds into bin/), then $PATH.
func findRunsc() string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "runsc")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
