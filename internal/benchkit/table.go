package benchkit

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes res for people: the environment, one row per latency
// series (milliseconds), the memory phases, then every error in full.
func WriteTable(w io.Writer, res *Result) error {
	e := res.Env
	reflink := "no"
	if e.Reflink {
		reflink = "yes"
	}
	fmt.Fprintf(w, "host     %s: %s, %d CPUs, %d MiB, %s, load %s\n", e.Hostname, e.CPUModel, e.CPUs, e.MemTotalMiB, e.Kernel, e.LoadAvg)
	fmt.Fprintf(w, "clade    %s (commit %s), daemon %s, engine %s, %s\n", e.CladeVersion, orDash(e.CladeCommit), e.DaemonVersion, e.Engine, orDash(e.Runsc))
	fmt.Fprintf(w, "data dir %s: %s, reflink %s\n", e.DataDir, e.DataDirFS, reflink)
	if e.BaselineRunsc != "" {
		fmt.Fprintf(w, "baseline %s (%s)\n", e.BaselineRunsc, e.BaselineRunscVersion)
	}
	fmt.Fprintf(w, "run      %s, %d samples after %d warm-up, %.0fs\n", strings.Join(e.CommandLine, " "), res.Config.Samples, res.Config.Warmup, res.Seconds)
	fmt.Fprintln(w)

	// The baseline columns: runsc's with --baseline; otherwise those of
	// phases that compare clade with itself (their series name the
	// baseline side, e.g. atrest's plain daemon).
	baseline, baseName := res.Config.Baseline, "runsc"
	if !baseline {
		for _, ph := range res.Phases {
			for _, s := range ph.Latency {
				if s.Baseline != nil {
					baseline, baseName = true, "base"
				}
			}
		}
	}
	// Right-aligned numbers, left-aligned names: pad names to one width.
	width := len("latency, ms")
	for _, ph := range res.Phases {
		for _, s := range ph.Latency {
			width = max(width, len(s.Name))
		}
		width = max(width, len(ph.Name))
	}
	name := func(s string) string { return fmt.Sprintf("%-*s", width, s) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := name("latency, ms") + "\tn\tp50\tp90\tp99\tmax\t"
	if baseline {
		head += baseName + " p50\t" + baseName + " p99\tratio p50\tratio p99\t"
	}
	rows := 0
	var errs []string
	for _, ph := range res.Phases {
		if ph.Error != "" {
			errs = append(errs, fmt.Sprintf("%s: %s", ph.Name, ph.Error))
		}
		if ph.BaselineError != "" {
			errs = append(errs, fmt.Sprintf("%s (baseline): %s", ph.Name, ph.BaselineError))
		}
		if ph.Memfork != nil || ph.Density != nil || ph.MassWake != nil || ph.Files != nil || ph.Storm != nil {
			continue
		}
		if rows == 0 {
			fmt.Fprintln(tw, head)
		}
		rows++
		if len(ph.Latency) == 0 || ph.Latency[0].Clade == nil && ph.Latency[0].Baseline == nil {
			fmt.Fprintf(tw, "%s\tfailed\t\t\t\t\t\n", name(ph.Name))
			continue
		}
		for _, s := range ph.Latency {
			row := name(s.Name) + "\t"
			if c := s.Clade; c != nil {
				row += fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t", c.N, ms(c.P50), ms(c.P90), ms(c.P99), ms(c.Max))
			} else {
				row += "failed\t\t\t\t\t"
			}
			if baseline {
				if b := s.Baseline; b != nil {
					row += fmt.Sprintf("%s\t%s\t", ms(b.P50), ms(b.P99))
				} else if ph.BaselineError != "" {
					row += "failed\t\t"
				} else {
					row += "--\t\t" // a clade-only series (e.g. exec, no spawn)
				}
				if r := s.Ratio; r != nil {
					row += fmt.Sprintf("%.2fx\t%.2fx\t", r.P50, r.P99)
				} else {
					row += "\t\t"
				}
			}
			fmt.Fprintln(tw, row)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, ph := range res.Phases {
		if m := ph.Memfork; m != nil {
			writeMemfork(w, m)
		}
		if d := ph.Density; d != nil {
			writeDensity(w, d)
		}
		if p := ph.Proxy; p != nil {
			fmt.Fprintf(w, "\nproxy: a %d MiB download at %.0f MiB/s via %s", p.MiB, p.ViaMiBs, p.Via)
			if p.DirectMiBs > 0 {
				fmt.Fprintf(w, ", %.0f MiB/s straight to the sandbox's address", p.DirectMiBs)
			}
			fmt.Fprintln(w)
		}
		if f := ph.Files; f != nil {
			fmt.Fprintf(w, "\nfiles: a %d MiB file pushed at %.0f MiB/s, pulled at %.0f MiB/s; %d files of %d KiB pushed at %.0f files/s (%.0f MiB/s), pulled at %.0f files/s\n",
				f.LargeMiB, f.PushMiBs, f.PullMiBs, f.SmallFiles, f.SmallKiB, f.PushFilesPS, f.PushSmallMiB, f.PullFilesPS)
		}
		if len(ph.Storm) > 0 {
			fmt.Fprintf(w, "\nstorm: creates+exec sent at once (ms from the wave's start to each exec's answer)\n")
			for _, s := range ph.Storm {
				fmt.Fprintf(w, "  %4d at once: %.1fs, %.1f/s", s.Width, s.Seconds, s.PerSecond)
				if l := s.Latency; l != nil {
					fmt.Fprintf(w, ", p50 %s p99 %s max %s", ms(l.P50), ms(l.P99), ms(l.Max))
				}
				fmt.Fprintf(w, "; %d failed, %d deferred (503, retried) in %d clients\n", s.Failed, s.Deferred, s.Retried)
			}
		}
		if c := ph.Code; c != nil && c.ForkChildren > 0 {
			fmt.Fprintf(w, "\ncode: fork of a context holding a %d MiB DataFrame (%d rows) into %d: %d of %d children answered len(df) correctly\n",
				c.ForkMiB, c.ForkRows, codeForkN, c.ForkCorrect, c.ForkChildren)
		}
		if a := ph.AtRest; a != nil {
			fmt.Fprintf(w, "\natrest: volume sequential %d MiB, write+fsync %.0f MiB/s encrypted vs %.0f plain, read %.0f MiB/s encrypted vs %.0f plain (p50)\n",
				a.MiB, a.EncWriteMiBs, a.PlainWriteMiBs, a.EncReadMiBs, a.PlainReadMiBs)
			if a.VolKeyWriteMiBs > 0 || a.VolKeyReadMiBs > 0 {
				fmt.Fprintf(w, "atrest: a volume with its own key (volume create --encrypt, no --encrypt-at-rest): write+fsync %.0f MiB/s vs %.0f plain, read %.0f vs %.0f (p50)\n",
					a.VolKeyWriteMiBs, a.PlainWriteMiBs, a.VolKeyReadMiBs, a.PlainReadMiBs)
			}
		}
		if m := ph.MassWake; m != nil {
			fmt.Fprintf(w, "\nmasswake: %d slept apps (%d MiB) woken by one request each at once, in %.1fs", m.Apps, m.MemoryMiB, m.Seconds)
			if l := m.Latency; l != nil {
				fmt.Fprintf(w, "; answered p50 %s p90 %s p99 %s max %s ms", ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max))
			}
			fmt.Fprintf(w, "\n  %d retried after a 503, %d failed; MemAvailable low-water %.0f MiB\n", m.Retried, m.Failed, m.MemAvailableLowMiB)
		}
	}
	if res.CleanupError != "" {
		errs = append(errs, "cleanup: "+res.CleanupError)
	}
	if len(errs) > 0 {
		fmt.Fprintln(w, "\nfailed:")
		for _, e := range errs {
			fmt.Fprintln(w, "  "+e)
		}
	}
	return nil
}

func writeMemfork(w io.Writer, m *Memfork) {
	fmt.Fprintf(w, "\nmemfork: %d children of one snapshot of a sandbox holding %d MiB (host MiB)\n", m.Children, m.HeldMiB)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-28s\tclade\trunsc\tratio\t\n", "")
	side := func(s *MemStats, f func(*MemStats) float64) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", f(s))
	}
	rat := func(v float64) string {
		if v == 0 {
			return ""
		}
		return fmt.Sprintf("%.2fx", v)
	}
	rows := []struct {
		name string
		f    func(*MemStats) float64
		r    float64
		// omitZero: a row with no value on either side is left out (the
		// cgroup row of QEMU children, which have no cgroup of their own).
		omitZero bool
	}{
		{"MemAvailable drop per child", func(s *MemStats) float64 { return s.AvailPerChildMiB }, m.AvailRatio, false},
		{"PSS per child", func(s *MemStats) float64 { return s.PSSPerChildMiB }, m.PSSRatio, false},
		{"cgroup anon+shmem per child", func(s *MemStats) float64 { return s.CgroupPerChildMiB }, m.CgroupRatio, true},
		{"PSS of the parent", func(s *MemStats) float64 { return s.ParentPSSMiB }, 0, false},
		{"fork wall time, ms", func(s *MemStats) float64 { return s.ForkMS }, 0, false},
	}
	zero := func(s *MemStats, f func(*MemStats) float64) bool { return s == nil || f(s) == 0 }
	for _, r := range rows {
		if r.omitZero && zero(m.Clade, r.f) && zero(m.Baseline, r.f) {
			continue
		}
		fmt.Fprintf(tw, "%-28s\t%s\t%s\t%s\t\n", r.name, side(m.Clade, r.f), side(m.Baseline, r.f), rat(r.r))
	}
	tw.Flush()
}

func writeDensity(w io.Writer, d *Density) {
	fmt.Fprintf(w, "\ndensity: %d of %d idle sandboxes (%d MiB limit), %.1f MiB each by MemAvailable", d.Reached, d.Target, d.MemoryMiB, d.PerSandboxMiB)
	if c := d.Create; c != nil {
		fmt.Fprintf(w, ", create p50 %s p99 %s ms", ms(c.P50), ms(c.P99))
	}
	fmt.Fprintf(w, ", removed in %.1fs\n", d.RemoveSeconds)
	if d.IdleSeconds > 0 {
		fmt.Fprintf(w, "  host CPU with them idle: %.1f%% of all cores (%.2f cores) over %.1fs\n", d.IdleCPUPercent, d.IdleCPUs, d.IdleSeconds)
	}
	if d.StopCause != "" {
		fmt.Fprintf(w, "  stopped: %s\n", d.StopCause)
	}
	var steps []string
	for _, s := range d.Steps {
		steps = append(steps, fmt.Sprintf("%d:%.0f", s.Sandboxes, s.MemAvailableMiB))
	}
	fmt.Fprintf(w, "  MemAvailable MiB by count: %s\n", strings.Join(steps, " "))
}

// ms formats milliseconds with precision where it matters.
func ms(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
