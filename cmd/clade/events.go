package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
			"Each line starts with the event's seq; --since SEQ resumes after it.",
		Example: "  clade events --follow --sandbox box\n" +
			"  last=$(clade events | tail -1 | cut -d' ' -f1)   # the newest seq (a large number)\n" +
			"  clade events -f --since \"$last\" --json",
		Args: nargs(0, 0),
	}
	fs := cmd.Flags()
	follow := fs.BoolP("follow", "f", false, "keep printing new events until interrupted")
	since := fs.Uint64("since", 0, "print the kept events after this `seq` first (with --follow: else only new ones)")
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
		f := sdk.EventFilter{Sandbox: *sandbox, Follow: *follow, Since: *since, Labels: lbl}
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

// formatEvent is one event as a line for people.
func formatEvent(e sdk.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d  %s  %-17s", e.Seq, e.Time.Local().Format("15:04:05.000"), e.Type)
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
