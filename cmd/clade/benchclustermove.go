package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/internal/benchkit"
	"github.com/clade-sandbox/clade/sdk"
)

// holdingSandbox makes the fork and wake cases' sandbox on node 1: its
// memory limit, with HoldMiB of it held in a file in memory.
func (b *clusterBench) holdingSandbox(ctx context.Context) (sdk.Sandbox, func(), error) {
	sb, err := b.nodes[0].CreateSandbox(ctx, sdk.CreateSandboxRequest{Image: b.cfg.Image, Node: b.names[0], MemoryMiB: b.cfg.MemoryMiB})
	if err != nil {
		return sdk.Sandbox{}, nil, err
	}
	remove := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		_ = b.nodes[0].DeleteSandbox(cctx, sb.ID)
	}
	if b.cfg.HoldMiB > 0 {
		var out strings.Builder
		st, err := b.nodes[0].Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c",
			fmt.Sprintf("head -c %dM /dev/urandom > /dev/shm/clade-bench-hold", b.cfg.HoldMiB)}, Stderr: &out})
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("filling %d MiB of its memory exited %d: %s", b.cfg.HoldMiB, st.Code, strings.TrimSpace(out.String()))
		}
		if err != nil {
			remove()
			return sdk.Sandbox{}, nil, err
		}
	}
	return sb, remove, nil
}

// forkAcross forks the sandbox on node 1 into Fork children on node 1
// alone, then spread across the nodes (--spread), Rounds times each,
// alternated: each fork's time, where the children went, and etcd's
// writes per child.
func (b *clusterBench) forkAcross(ctx context.Context) error {
	sb, remove, err := b.holdingSandbox(ctx)
	if err != nil {
		return err
	}
	defer remove()
	type series struct {
		lat    []float64
		nodes  map[string]int
		writes int64
		kids   int
	}
	one, spread := &series{nodes: map[string]int{}}, &series{nodes: map[string]int{}}
	fork := func(s *series, opts ...sdk.ForkOption) error {
		var rev0 int64
		if b.writes != nil {
			b.writes.settle()
			rev0 = b.writes.count()
		}
		t0 := time.Now()
		res, err := b.nodes[0].Fork(ctx, sb.ID, b.cfg.Fork, opts...)
		d := time.Since(t0)
		var failed []string
		for _, ch := range res.Children {
			if ch.ID == "" {
				failed = append(failed, fmt.Sprintf("on %s: %s", ch.Node, ch.Error))
			}
		}
		if b.writes != nil && err == nil {
			b.writes.settle()
			s.writes += b.writes.count() - rev0
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		for _, ch := range res.Children {
			if ch.ID != "" {
				_ = b.nodes[0].DeleteSandbox(cctx, ch.ID)
			}
		}
		if err != nil {
			return err
		}
		if len(failed) > 0 {
			return fmt.Errorf("%d of %d children failed: %s", len(failed), b.cfg.Fork, strings.Join(failed, "; "))
		}
		s.lat = append(s.lat, float64(d.Microseconds())/1000)
		s.kids += len(res.Children)
		for _, ch := range res.Children {
			s.nodes[ch.Node]++
		}
		return nil
	}
	for r := range b.cfg.Rounds {
		if err := fork(one); err != nil {
			return fmt.Errorf("fork on one node: %w", err)
		}
		if err := fork(spread, sdk.Spread()); err != nil {
			return fmt.Errorf("fork across the nodes: %w", err)
		}
		fmt.Fprintf(os.Stderr, "fork round %d/%d: on one node %.0f ms, across the nodes %.0f ms\n", r+1, b.cfg.Rounds, one.lat[r], spread.lat[r])
	}
	tw := tabwriter.NewWriter(b.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "fork of %d (%d MiB sandbox holding %d MiB), %d rounds side by side\tp50 ms\tmax ms\tchildren by node\tetcd writes per child\n",
		b.cfg.Fork, b.cfg.MemoryMiB, b.cfg.HoldMiB, b.cfg.Rounds)
	for _, row := range []struct {
		what string
		s    *series
	}{{"on one node (" + b.names[0] + ")", one}, {"across the nodes (--spread)", spread}} {
		slices.Sort(row.s.lat)
		writes := "-"
		if b.writes != nil {
			writes = fmt.Sprintf("%.2f", float64(row.s.writes)/float64(row.s.kids))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s\t%s\n", row.what, benchkit.Percentile(row.s.lat, 0.5), row.s.lat[len(row.s.lat)-1], nodeCounts(row.s.nodes), writes)
	}
	if b.writes != nil {
		b.childWrites = float64(one.writes+spread.writes) / float64(one.kids+spread.kids)
	}
	return tw.Flush()
}

// wakeAcross sleeps the sandbox and wakes it on the node that slept it
// (local), then sleeps it and wakes it on the next node (its image
// fetched from the object store), Rounds times each, alternated: each
// wake's time as the client sees it. Every sleep waits for the image's
// copy in the store first, so both kinds start alike.
func (b *clusterBench) wakeAcross(ctx context.Context) error {
	ns, err := b.nodes[0].ListNodes(ctx)
	if err != nil {
		return err
	}
	var without []string
	for _, n := range ns {
		if n.Capacity.StoreKey == "" {
			without = append(without, n.Name)
		}
	}
	if len(without) > 0 {
		fmt.Fprintf(b.out, "wake: not measured: node(s) %s have no --object-store (a sandbox asleep on one node wakes on another only from it)\n", strings.Join(without, ", "))
		return nil
	}
	sb, remove, err := b.holdingSandbox(ctx)
	if err != nil {
		return err
	}
	defer remove()
	client := map[string]*sdk.Client{}
	for i, n := range b.names {
		client[n] = b.nodes[i]
	}
	holder := b.names[0]
	sleep := func() error {
		if _, err := client[holder].Sleep(ctx, sb.ID); err != nil {
			return fmt.Errorf("sleep on %s: %w", holder, err)
		}
		for end := time.Now().Add(10 * time.Minute); ; {
			got, err := client[holder].GetSandbox(ctx, sb.ID)
			if err != nil {
				return err
			}
			if got.SleepImage != "" {
				return nil
			}
			if time.Now().After(end) {
				return errors.New("its sleep image has no copy in the object store 10 minutes after the sleep")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond): // polling the copy's upload
			}
		}
	}
	var local, other []float64
	for r := range b.cfg.Rounds {
		if err := sleep(); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := client[holder].Wake(ctx, sb.ID); err != nil {
			return fmt.Errorf("wake on %s: %w", holder, err)
		}
		local = append(local, float64(time.Since(t0).Microseconds())/1000)
		if err := sleep(); err != nil {
			return err
		}
		to := b.names[(slices.Index(b.names, holder)+1)%len(b.names)]
		t0 = time.Now()
		woke, err := client[to].WakeOn(ctx, sb.ID, to)
		if err != nil {
			return fmt.Errorf("wake on %s of a sandbox asleep on %s: %w", to, holder, err)
		}
		other = append(other, float64(time.Since(t0).Microseconds())/1000)
		if woke.Node != to {
			return fmt.Errorf("asked to wake on %s, it woke on %s", to, woke.Node)
		}
		fmt.Fprintf(os.Stderr, "wake round %d/%d: on %s (local) %.0f ms, on %s (from %s) %.0f ms\n", r+1, b.cfg.Rounds, holder, local[r], to, holder, other[r])
		holder = to
	}
	if b.cfg.HoldMiB > 0 {
		var out strings.Builder
		st, err := client[holder].Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"stat", "-c", "%s", "/dev/shm/clade-bench-hold"}, Stdout: &out})
		if err != nil || st.Code != 0 || strings.TrimSpace(out.String()) != fmt.Sprint(b.cfg.HoldMiB<<20) {
			return fmt.Errorf("the %d MiB it held did not survive the moves: %v exit %d, %q bytes", b.cfg.HoldMiB, err, st.Code, strings.TrimSpace(out.String()))
		}
	}
	slices.Sort(local)
	slices.Sort(other)
	lp, op := benchkit.Percentile(local, 0.5), benchkit.Percentile(other, 0.5)
	tw := tabwriter.NewWriter(b.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "wake (%d MiB sandbox holding %d MiB), %d rounds side by side\tp50 ms\tmax ms\n", b.cfg.MemoryMiB, b.cfg.HoldMiB, b.cfg.Rounds)
	fmt.Fprintf(tw, "on the node that slept it\t%.0f\t%.0f\n", lp, local[len(local)-1])
	fmt.Fprintf(tw, "on another node (image from the object store)\t%.0f\t%.0f\n", op, other[len(other)-1])
	fmt.Fprintf(tw, "other node / local (p50)\t%.2fx\t\n", op/lp)
	return tw.Flush()
}

// nodeCounts writes a map of node -> count as "n1:4 n2:4", by name.
func nodeCounts(m map[string]int) string {
	var out []string
	for n, k := range m {
		out = append(out, fmt.Sprintf("%s:%d", n, k))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
