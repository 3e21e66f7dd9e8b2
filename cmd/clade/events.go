package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/clade-sandbox/clade/sdk"
)

func cmdEvents(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("events", "events [--follow] [--since SEQ] [--sandbox ID] [--label K=V]... [--json]\n\nPrints the daemon's lifecycle events (created, started, exec.started, exec.ended,\nsnapshotted, forked, slept, woken, stopped, removed, admission.refused), oldest\nfirst: the recent ones it keeps, or with --follow the new ones as they happen.\nEach line starts with the event's seq; --since SEQ resumes after it.")
	follow := fs.Bool("follow", false, "keep printing new events until interrupted")
	fs.BoolVar(follow, "f", false, "short for --follow")
	since := fs.Uint64("since", 0, "print the kept events after this seq first (with --follow: else only new ones)")
	sandbox := fs.String("sandbox", "", "only events of this sandbox (id or name)")
	var labels multi
	fs.Var(&labels, "label", "only events of sandboxes with label K=V (repeatable; all must match)")
	asJSON := fs.Bool("json", false, "print each event as a line of JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	f := sdk.EventFilter{Sandbox: *sandbox, Follow: *follow, Since: *since}
	for _, kv := range labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: give K=V", kv)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
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
