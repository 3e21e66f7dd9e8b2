package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
)

func newEventsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events [flags]",
		Short: "Print lifecycle events, or follow them as they happen",
		Long: "Prints the daemon's lifecycle events (created, started, exec.started, exec.ended,\n" +
			"snapshotted, forked, slept, woken, stopped, removed, admission.refused), oldest\n" +
			"first: the recent ones it keeps, or with --follow the new ones as they happen.\n" +
			"Each line starts with the event's seq; --since SEQ resumes after it.\n\n" +
			"In a cluster it prints every live node's events, merged (--cluster=false: only\n" +
			"those of the node it talks to). Each line then starts with NODE:SEQ, and a\n" +
			"node's part ends with node.left (its lease lapsed, it restarted, it stopped\n" +
			"answering) and one picked up later starts with node.joined. Resume a merged\n" +
			"stream with --since NODE:SEQ,NODE:SEQ (each node's last seq; a node not named\n" +
			"replays every event it keeps).",
		Example: "  clade events --follow --sandbox box\n" +
			"  last=$(clade events | tail -1 | cut -d' ' -f1)   # the newest seq (a large number)\n" +
			"  clade events -f --since \"$last\" --json\n" +
			"  clade events -f --since n1:1733480000000123,n2:1733480000000456   # a cluster's, resumed",
		Args: nargs(0, 0),
	}
	fs := cmd.Flags()
	follow := fs.BoolP("follow", "f", false, "keep printing new events until interrupted")
	since := fs.String("since", "", "print the kept events after this `seq` first (with --follow: else only new ones); in a cluster NODE:SEQ,NODE:SEQ,...")
	cluster := fs.Bool("cluster", true, "in a cluster, every live node's events merged (false: only the node's the CLI talks to)")
	sandbox := fs.String("sandbox", "", "only events of this sandbox (`id` or name)")
	var labels multi
	fs.Var(&labels, "label", "only events of sandboxes with label `K=V` (repeatable; all must match)")
	asJSON := fs.Bool("json", false, "print each event as a line of JSON")
	_ = cmd.RegisterFlagCompletionFunc("sandbox", completeSandboxes)
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		lbl, err := parseLabels(labels)
		if err != nil {
			return err
		}
		f := sdk.EventFilter{Sandbox: *sandbox, Follow: *follow, Labels: lbl, Cluster: *cluster}
		if err := parseSince(*since, &f); err != nil {
			return err
		}
		evs, err := c.Events(ctx, f)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		for e, err := range evs {
			if err != nil {
				return err
			}
			if *asJSON {
				if err := enc.Encode(e); err != nil {
					return err
				}
				continue
			}
			fmt.Println(formatEvent(e))
		}
		return nil
	})
	return cmd
}

// parseSince sets f's position from --since: a seq, or (in a cluster's
// merged stream) NODE:SEQ,NODE:SEQ,...
func parseSince(v string, f *sdk.EventFilter) error {
	if v == "" {
		return nil
	}
	if strings.Contains(v, ":") {
		if !f.Cluster {
			return badArg("--since %s: NODE:SEQ positions are for a cluster's merged stream (without --cluster=false)", v)
		}
		p, err := sdk.ParsePositions(v)
		if err != nil {
			return badArg("--since %s: %v (give NODE:SEQ,NODE:SEQ,...)", v, err)
		}
		f.Positions = p
		return nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return badArg("--since %s: give the seq of the last event printed (a whole number), or NODE:SEQ,... in a cluster", v)
	}
	f.Since = n
	return nil
}

// formatEvent is one event as a line for people.
func formatEvent(e sdk.Event) string {
	var b strings.Builder
	seq := strconv.FormatUint(e.Seq, 10)
	if e.Seq == 0 {
		seq = "-"
	}
	if e.Node != "" {
		seq = e.Node + ":" + seq // a cluster's: where the seq is of
	}
	fmt.Fprintf(&b, "%s  %s  %-17s", seq, e.Time.Local().Format("15:04:05.000"), e.Type)
	if e.Sandbox != "" {
		b.WriteString("  " + e.Sandbox)
		if e.Name != "" {
			b.WriteString(" (" + e.Name + ")")
		}
	}
	if e.Snapshot != "" {
		b.WriteString("  snapshot " + e.Snapshot)
	}
	if len(e.Children) > 0 || e.Failed > 0 {
		fmt.Fprintf(&b, "  children %s", strings.Join(e.Children, ","))
		if e.Failed > 0 {
			fmt.Fprintf(&b, " (%d failed)", e.Failed)
		}
	}
	if x := e.Exec; x != nil {
		b.WriteString("  " + strings.Join(x.Cmd, " "))
		if e.Type == "exec.ended" {
			fmt.Fprintf(&b, "  -> %d", x.Code)
			if x.TimedOut {
				b.WriteString(" (timed out)")
			}
			if x.Error != "" {
				b.WriteString(": " + x.Error)
			}
		}
	}
	if e.Reason != "" {
		b.WriteString("  " + e.Reason)
	}
	return b.String()
}
