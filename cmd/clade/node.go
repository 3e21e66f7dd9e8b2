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
		Short:   "List the nodes of the daemon's cluster",
		Example: "  clade node ls\n  clade node ls --json",
		Long:    "A daemon started with --cluster is a node of a cluster (see docs/cluster.md).",
	})
	cmd.AddCommand(newNodeListCmd())
	return cmd
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
		fmt.Fprintln(tw, "NAME\tADDRESS\tSANDBOXES\tRUNNING\tADMITTED\tAVAILABLE\tMEMORY\tCORES\tENGINES\tIMAGES\tLEASE AGE\tJOINED")
		for _, n := range ns {
			name := n.Name
			if n.Self {
				name += " *"
			}
			k := n.Capacity
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%d\t%s\t%d\t%s\t%s ago\n", name, n.Addr, k.Sandboxes, k.Running,
				k.MemoryAdmittedMiB, k.MemAvailableMiB, k.MemoryTotalMiB, k.Cores, dash(strings.Join(k.Engines, ",")), len(k.Images),
				(time.Duration(n.LeaseAgeMS) * time.Millisecond).Round(100*time.Millisecond), time.Since(n.JoinedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}
