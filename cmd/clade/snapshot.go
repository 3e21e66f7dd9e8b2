package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

func cmdSnapshot(ctx context.Context, c *sdk.Client, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "ls", "list":
			return cmdSnapshotList(ctx, c, args[1:])
		case "rm", "remove":
			return cmdSnapshotRemove(ctx, c, args[1:])
		}
	}
	fs := newFlags("snapshot", "snapshot ID [--name NAME]   freeze a running sandbox (it keeps running); prints the snapshot id\n       clade snapshot ls [--json]\n       clade snapshot rm SNAP...")
	name := fs.String("name", "", "unique name for the snapshot")
	ref, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	snap, err := c.SnapshotSandbox(ctx, ref, *name)
	if err != nil {
		return err
	}
	fmt.Println(snap.ID)
	return nil
}

// parseOneArg parses flags around exactly one positional argument, which
// may come before or after them.
func parseOneArg(fs *flag.FlagSet, args []string) (string, error) {
	var pos string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		pos, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", exitError{0}
		}
		return "", errUsage
	}
	rest := fs.Args()
	if pos == "" && len(rest) > 0 {
		pos, rest = rest[0], rest[1:]
	}
	if pos == "" || len(rest) > 0 {
		fs.Usage()
		return "", errUsage
	}
	return pos, nil
}

func cmdSnapshotList(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("snapshot ls", "snapshot ls [--json]\n\nLists snapshots and the sandboxes restored from them.")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
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
}

func cmdSnapshotRemove(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("snapshot rm", "snapshot rm SNAP...\n\nRemoves snapshots no sandbox was restored from.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	return removeEach(fs.Args(), false, func(ref string) error { return c.DeleteSnapshot(ctx, ref) })
}

func cmdFork(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("fork", "fork SNAP|ID -n N [--json]\n\nRestores N new sandboxes from a snapshot, or from a running sandbox (which is\nsnapshotted first and keeps running), in one call. Prints one child id per\nline; a child that failed is reported on stderr and the exit code is 1.")
	n := fs.Int("n", 1, "number of children")
	asJSON := fs.Bool("json", false, "print the whole result as JSON")
	src, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	res, err := c.Fork(ctx, src, *n)
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
}

func cmdWake(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("wake", "wake ID\n\nRestores a sleeping sandbox in place: same id, files and running processes.")
	ref, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	sb, err := c.Wake(ctx, ref)
	if err != nil {
		return err
	}
	fmt.Println(sb.ID)
	return nil
}
