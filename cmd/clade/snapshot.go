package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
)

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot ID [flags]",
		Aliases: []string{"snapshots"},
		Short:   "Snapshot a running sandbox (it keeps running); list and remove snapshots",
		Long: "Freezes a running sandbox's memory and files into a snapshot, which it keeps\n" +
			"running through, and prints the snapshot's id. Restore it with\n" +
			"clade create --from SNAP or clade fork SNAP -n N.",
		Example:           "  clade snapshot box --name warm\n  clade snapshot ls\n  clade snapshot rm warm",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	name := cmd.Flags().String("name", "", "unique name for the snapshot")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		snap, err := c.SnapshotSandbox(ctx, args[0], *name)
		if err != nil {
			return err
		}
		fmt.Println(snap.ID)
		return nil
	})
	cmd.AddCommand(newSnapshotListCmd(), newSnapshotRemoveCmd())
	return cmd
}

func newSnapshotListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List snapshots and the sandboxes restored from them",
		Example: "  clade snapshot ls\n  clade snapshot ls --json | jq -r '.[].id'",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		snaps, err := c.ListSnapshots(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(snaps)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tSIZE\tUSED BY\tCREATED")
		for _, s := range snaps {
			name := dash(s.Name)
			if s.Implicit {
				name = "(implicit)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%d\t%s ago\n", s.ID, name, s.Sandbox, s.SizeBytes>>20, len(s.UsedBy), time.Since(s.CreatedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}

func newSnapshotRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "rm SNAP...",
		Aliases:           []string{"remove"},
		Short:             "Remove snapshots no sandbox was restored from",
		Example:           "  clade snapshot rm warm\n  clade snapshot rm warm 5e75caf9d2d64b3d",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeSnapshots,
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			return removeEach(args, false, func(ref string) error { return c.DeleteSnapshot(ctx, ref) })
		}),
	}
}

func newForkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fork SNAP|ID [flags]",
		Short: "Restore N new sandboxes from a snapshot or a running sandbox",
		Long: "Restores N new sandboxes from a snapshot, or from a running sandbox (which is\n" +
			"snapshotted first and keeps running), in one call. Prints one child id per\n" +
			"line; a child that failed is reported on stderr and the exit code is 1.\n\n" +
			"In a cluster the fork runs on the node that holds the source, and its\n" +
			"children stay there (they share the snapshot's memory) unless that node has\n" +
			"no room for them; --spread places them across the nodes by free memory\n" +
			"(the others fetch the snapshot by digest and verify it). --json says each\n" +
			"child's node.",
		Example:           "  clade fork box -n 16\n  clade fork warm -n 4 --json\n  clade fork box -n 6 --spread",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(complete(snapshotNames, sandboxNames)),
	}
	n := cmd.Flags().IntP("count", "n", 1, "number of children")
	asJSON := cmd.Flags().Bool("json", false, "print the whole result as JSON")
	spread := cmd.Flags().Bool("spread", false, "in a cluster, place the children across the nodes")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if *n < 1 {
			return badArg("-n %d: give the number of children, 1 or more", *n)
		}
		var opts []sdk.ForkOption
		if *spread {
			opts = append(opts, sdk.Spread())
		}
		res, err := c.Fork(ctx, args[0], *n, opts...)
		if err != nil {
			return err
		}
		failed := 0
		for _, ch := range res.Children {
			if ch.Error != "" {
				failed++
			}
		}
		if *asJSON {
			if err := printJSON(res); err != nil {
				return err
			}
		} else {
			for _, ch := range res.Children {
				if ch.Error != "" {
					fmt.Fprintln(os.Stderr, "clade: child failed:", ch.Error)
					continue
				}
				fmt.Println(ch.ID)
			}
		}
		if failed > 0 {
			fmt.Fprintf(os.Stderr, "clade: %d of %d children failed\n", failed, len(res.Children))
			return exitError{1}
		}
		return nil
	})
	return cmd
}

func newWakeCmd() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "wake ID",
		Short: "Wake a sleeping sandbox",
		Long: "Restores a sleeping sandbox in place: same id, files and running processes.\n" +
			"Waking a running sandbox does nothing. The next exec, file copy or ingress\n" +
			"request wakes a sleeping sandbox too.\n\n" +
			"In a cluster, --node wakes it on that node: a sandbox asleep on another node\n" +
			"is moved there first, its sleep image fetched from the object store (the\n" +
			"daemons need --object-store, and the image its copy there: `clade inspect`\n" +
			"shows sleep_image once it has one). It prints the node it woke on.",
		Example:           "  clade sleep box && clade wake box\n  clade wake box --node n2",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSandboxes),
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			if node == "" {
				sb, err := c.Wake(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Println(sb.ID)
				return nil
			}
			sb, err := c.WakeOn(ctx, args[0], node)
			if err != nil {
				return err
			}
			fmt.Printf("%s\t%s\n", sb.ID, sb.Node)
			return nil
		}),
	}
	cmd.Flags().StringVar(&node, "node", "", "in a cluster, the node `NAME` to wake it on (moved there first if it sleeps on another)")
	return cmd
}
