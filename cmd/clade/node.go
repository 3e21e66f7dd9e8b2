package main

import (
	"context"
	"fmt"
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
		Use:     "drain NAME [--undo]",
		Short:   "Stop placing new sandboxes on a node; its sleeping sandboxes with a copy in the object store move off (they wake elsewhere)",
		Example: "  clade node drain n2\n  clade node drain n2 --undo",
		Args:    nargs(1, 1),
	}
	undo := cmd.Flags().Bool("undo", false, "undrain: let placement pick the node again (as clade node undrain)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		return drain(ctx, c, args[0], !*undo)
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
		fmt.Printf("%s draining: no new sandboxes are placed on it, its sleeping sandboxes in the object store wake on other nodes (clade node undrain %s)\n", name, name)
	} else {
		fmt.Printf("%s ready: placement may pick it again\n", name)
	}
	return nil
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
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%d\t%s\t%d\t%s\t%s ago\n", name, state, n.Addr, k.Sandboxes, k.Running,
				k.MemoryAdmittedMiB, k.MemAvailableMiB, k.MemoryTotalMiB, k.Cores, dash(strings.Join(k.Engines, ",")), len(k.Images),
				(time.Duration(n.LeaseAgeMS) * time.Millisecond).Round(100*time.Millisecond), time.Since(n.JoinedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}
