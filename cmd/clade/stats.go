package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
	"golang.org/x/sys/unix"
)

func newStatsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats [flags] [ID...]",
		Short: "Show sandboxes' CPU, memory and processes, refreshed live",
		Long: "Shows the CPU, memory and process count of the sandboxes (every sandbox\n" +
			"without IDs), refreshed every --interval until interrupted. CPU % is of one\n" +
			"core: 200% is two cores busy.",
		Example:           "  clade stats\n  clade stats --no-stream box other",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: completeSandboxes,
	}
	fs := cmd.Flags()
	noStream := fs.Bool("no-stream", false, "print one reading and exit")
	asJSON := fs.Bool("json", false, "print one reading of each sandbox as JSON and exit (CPU as cumulative cpu_ns)")
	interval := fs.Duration("interval", time.Second, "time between refreshes (and, with --no-stream, between the two readings CPU % is taken from)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, ids []string) error {
		if *interval < 10*time.Millisecond {
			return fmt.Errorf("--interval %s is too short: use at least 10ms", *interval)
		}
		if *asJSON {
			sts, err := c.StatsList(ctx, ids...)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(sts)
		}
		prev, err := c.StatsList(ctx, ids...)
		if err != nil {
			return err
		}
		wait := *interval
		if *noStream {
			wait = min(*interval, 500*time.Millisecond)
		}
		tty := isTerminal(os.Stdout)
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			cur, err := c.StatsList(ctx, ids...)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if tty && !*noStream {
				fmt.Print("\033[H\033[2J") // home and clear, like top
			}
			writeStats(os.Stdout, prev, cur)
			if *noStream {
				return nil
			}
			prev = cur
		}
	})
	return cmd
}

// writeStats prints a table of the readings in cur, CPU % from prev.
func writeStats(w io.Writer, prev, cur []sdk.SandboxStats) {
	before := map[string]sdk.SandboxStats{}
	for _, s := range prev {
		before[s.ID] = s
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// A cluster's readings say where each sandbox is, as clade ls does.
	cluster := slices.ContainsFunc(cur, func(s sdk.SandboxStats) bool { return s.Node != "" && s.Node != "local" })
	if cluster {
		fmt.Fprintln(tw, "ID\tNAME\tNODE\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS")
	} else {
		fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS")
	}
	var notes []string // why some have no reading (a node that did not answer)
	for _, s := range cur {
		cpu, mem, memPct, pids := "--", "--", "--", "--"
		if s.State == "running" && s.MemoryBytes > 0 {
			if p, ok := before[s.ID]; ok {
				cpu = fmt.Sprintf("%.2f%%", sdk.CPUPercent(p, s))
			}
			mem = humanBytes(s.MemoryBytes) + " / " + humanBytes(s.MemoryLimitBytes)
			if s.MemoryLimitBytes > 0 {
				memPct = fmt.Sprintf("%.2f%%", float64(s.MemoryBytes)/float64(s.MemoryLimitBytes)*100)
			}
			pids = fmt.Sprint(s.Pids)
		}
		name := s.Name
		if name == "" {
			name = "-"
		}
		if s.Error != "" && !slices.Contains(notes, s.Error) {
			notes = append(notes, s.Error)
		}
		if cluster {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, name, s.Node, s.State, cpu, mem, memPct, pids)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, name, s.State, cpu, mem, memPct, pids)
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, "note: "+n)
	}
}

// humanBytes prints n in binary units, like docker stats: 12.5MiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%s", float64(n)/float64(div), strings.Split("KiB MiB GiB TiB PiB", " ")[exp])
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
