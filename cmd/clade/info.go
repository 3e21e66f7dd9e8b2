package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
)

func newInfoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "info [flags]",
		Short: "Show the daemon's version, engines and pools",
		Long: "Shows the daemon's version, which engines it runs (the default first) and which\n" +
			"it lacks on this host with what is missing, and the warm and hot pools.\n" +
			"A sandbox asking for an engine the host lacks is refused, never run by another.",
		Example: "  clade info\n  clade info --json",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print GET /v1/health's answer as JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, _ []string) error {
		h, err := c.Health(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(h)
		}
		fmt.Printf("version: %s\n", h.Version)
		if h.EngineVersion != "" {
			fmt.Printf("engine version: %s\n", h.EngineVersion)
		}
		fmt.Printf("pools: %d warm, %d hot\n", h.Warm, h.Hot)
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ENGINE\tSTATUS\tNOTE")
		for _, e := range h.Engines {
			status, note := "available", ""
			if e.Default {
				note = "default"
			}
			if !e.Available {
				status, note = "not available", e.Reason
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Name, status, note)
		}
		return tw.Flush()
	})
	return cmd
}
