package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
)

func newNodeCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "node VERB",
		Aliases: []string{"nodes"},
		Short:   "List and drain the nodes of the daemon's cluster",
		Example: "  clade node ls\n  clade node drain n2\n  clade node undrain n2",
		Long:    "A daemon started with --cluster is a node of a cluster (see docs/cluster.md).",
	})
	cmd.AddCommand(newNodeListCmd(), newNodeDrainCmd(), newNodeUndrainCmd())
	return cmd
}

func newNodeDrainCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drain NAME [--undo]",
		Short: "Stop placing new sandboxes on a node and move its sandboxes off: sleeping ones, and idle running ones (slept, then woken on another node)",
		Long: "The drained node puts its idle running sandboxes to sleep and gives them, with its sleeping ones, to other nodes\n" +
			"(their images go through the object store: nodes need --object-store). A sandbox that was running is woken on its\n" +
			"new node at once; busy ones (an exec, attach or file call in flight, a connection open) stay until they are idle.\n" +
			"The command follows the drain until only what holds it is left (or --no-wait), and lists what holds it.",
		Example: "  clade node drain n2\n  clade node drain n2 --no-wait\n  clade node drain n2 --undo",
		Args:    nargs(1, 1),
	}
	undo := cmd.Flags().Bool("undo", false, "undrain: let placement pick the node again (as clade node undrain)")
	noWait := cmd.Flags().Bool("no-wait", false, "mark the node draining and return: the node moves its sandboxes off in the background")
	wait := cmd.Flags().Duration("wait", 10*time.Minute, "follow the drain for at most this long (it goes on after)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if err := drain(ctx, c, args[0], !*undo); err != nil || *undo || *noWait {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *wait)
		defer cancel()
		return followDrain(ctx, c, args[0], os.Stdout, 500*time.Millisecond)
	})
	return cmd
}

func newNodeUndrainCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "undrain NAME",
		Short:   "Let placement pick a drained node again",
		Example: "  clade node undrain n2",
		Args:    nargs(1, 1),
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			return drain(ctx, c, args[0], false)
		}),
	}
}

func drain(ctx context.Context, c *sdk.Client, name string, on bool) error {
	var err error
	if on {
		_, err = c.DrainNode(ctx, name)
	} else {
		_, err = c.UndrainNode(ctx, name)
	}
	if err != nil {
		return err
	}
	if on {
		fmt.Printf("%s draining: no new sandboxes are placed on it; its sandboxes move to other nodes (clade node undrain %s)\n", name, name)
	} else {
		fmt.Printf("%s ready: placement may pick it again\n", name)
	}
	return nil
}

// followDrain prints the drained node's progress (what moved, what is
// left) as it changes, until only what holds the drain is left; then it
// lists what holds it. The node writes its progress about every second.
func followDrain(ctx context.Context, c *sdk.Client, name string, w io.Writer, every time.Duration) error {
	first, last, retries := int64(-1), "", 0
	var p *sdk.DrainProgress
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ns, err := c.ListNodes(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		var n *sdk.Node
		for i := range ns {
			if ns[i].Name == name {
				n = &ns[i]
			}
		}
		switch {
		case n == nil && ctx.Err() == nil:
			return fmt.Errorf("node %s left the cluster while it was draining", name)
		case n != nil && !n.Draining:
			fmt.Fprintf(w, "%s is no longer draining (undrained)\n", name)
			return nil
		case n != nil && n.Drain != nil:
			p = n.Drain
			if first < 0 {
				first = p.Pass
			}
			if p.Retried != "" && p.Retries != retries {
				// A sandbox held for room moves on: a node has room now.
				fmt.Fprintf(w, "%s: %s\n", name, p.Retried)
				retries = p.Retries
			}
			line := fmt.Sprintf("%s: %d moved, %d left (%d running, %d sleeping)", name, p.Moved, p.Running+p.Sleeping, p.Running, p.Sleeping)
			if line != last {
				fmt.Fprintln(w, line)
				last = line
			}
		}
		// Settled over a whole pass after the mark: what is left holds it.
		if p != nil && p.Settled && p.Pass >= first+2 {
			break
		}
		select {
		case <-ctx.Done():
			if p == nil {
				return fmt.Errorf("node %s has told no drain progress yet (a node of an older version moves only its sleeping sandboxes): see clade node ls", name)
			}
			fmt.Fprintf(w, "%s: still draining in the background\n", name)
			printHolds(w, p)
			return nil
		case <-t.C:
		}
	}
	if p.Note != "" {
		fmt.Fprintf(w, "%s: %s\n", name, p.Note)
	}
	if len(p.Held) == 0 {
		fmt.Fprintf(w, "%s drained: %d moved, nothing left on it\n", name, p.Moved)
		return nil
	}
	fmt.Fprintf(w, "%s: %d moved; %d stay, holding the drain:\n", name, p.Moved, len(p.Held))
	printHolds(w, p)
	return nil
}

func printHolds(w io.Writer, p *sdk.DrainProgress) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tNAME\tSTATE\tWHY")
	for _, h := range p.Held {
		why := h.Why
		if h.Busy {
			why = "busy: " + why + " (moves once idle)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", h.ID, dash(h.Name), h.State, why)
	}
	_ = tw.Flush()
}

func newNodeListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List the cluster's live nodes and their capacity",
		Example: "  clade node ls\n  clade node ls --json",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		ns, err := c.ListNodes(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(ns)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tSANDBOXES\tRUNNING\tADMITTED\tAVAILABLE\tMEMORY\tCORES\tENGINES\tIMAGES\tLEASE AGE\tJOINED")
		for _, n := range ns {
			name := n.Name
			if n.Self {
				name += " *"
			}
			k := n.Capacity
			state := "ready"
			if n.Draining {
				state = "draining"
				if d := n.Drain; d != nil {
					state = fmt.Sprintf("draining (%d moved, %d left)", d.Moved, d.Running+d.Sleeping)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%d\t%s\t%d\t%s\t%s ago\n", name, state, n.Addr, k.Sandboxes, k.Running,
				k.MemoryAdmittedMiB, k.MemAvailableMiB, k.MemoryTotalMiB, k.Cores, dash(strings.Join(k.Engines, ",")), len(k.Images),
				(time.Duration(n.LeaseAgeMS) * time.Millisecond).Round(100*time.Millisecond), time.Since(n.JoinedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}
