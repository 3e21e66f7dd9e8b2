package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/sdk"
	"golang.org/x/sys/unix"
)

func cmdStats(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("stats", "stats [--no-stream] [--json] [--interval DUR] [ID...]\n\nShows the CPU, memory and process count of the sandboxes (every sandbox\nwithout IDs), refreshed every --interval until interrupted. CPU % is of one\ncore: 200% is two cores busy.")
	noStream := fs.Bool("no-stream", false, "print one reading and exit")
	asJSON := fs.Bool("json", false, "print one reading of each sandbox as JSON and exit (CPU as cumulative cpu_ns)")
	interval := fs.Duration("interval", time.Second, "time between refreshes (and, with --no-stream, between the two readings CPU % is taken from)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *interval < 10*time.Millisecond {
		return fmt.Errorf("--interval %s is too short: use at least 10ms", *interval)
	}
	ids := fs.Args()
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
}

// writeStats prints a table of the readings in cur, CPU % from prev.
func writeStats(w io.Writer, prev, cur []sdk.SandboxStats) {
	before := map[string]sdk.SandboxStats{}
	for _, s := range prev {
		before[s.ID] = s
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, name, s.State, cpu, mem, memPct, pids)
	}
	tw.Flush()
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
