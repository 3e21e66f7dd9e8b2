// Package bench holds clade's go-test benchmarks: the SDK -> daemon -> agent
// path side by side with the same work done by plain runsc commands, in one
// run on one machine. Run with `make bench`; figures go to
// docs/benchmarks.md, never into assertions.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// report adds p50/p99 of samples to b's output.
func report(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	q := func(p float64) float64 {
		return float64(samples[min(len(samples)-1, int(p*float64(len(samples))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles are the figures
}

func runscFlags(d *testenv.Daemon, id string) []string {
	return []string{"--root", filepath.Join(d.DataDir, "gvisor", "runsc"), "--platform", "systrap", "--network", "none",
		"--host-uds", "open", "--overlay2", "root:dir=" + filepath.Join(d.DataDir, "gvisor", "sandboxes", id, "upper")}
}

// BenchmarkExec is an exec round trip of `true`: through the SDK (one
// long-lived agent connection) and, as the baseline, `runsc exec`.
func BenchmarkExec(b *testing.B) {
	d := testenv.StartDaemon(b)
	sb, err := d.Client.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	runsc := testenv.Runsc(b)
	b.Run("sdk", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			start := time.Now()
			st, err := d.Client.Exec(context.Background(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}})
			if err != nil || st.Code != 0 {
				b.Fatal(err, st)
			}
			samples = append(samples, time.Since(start))
		}
		report(b, samples)
	})
	// A command that does not exist: the whole SDK -> daemon -> agent round
	// trip without a process spawn, which inside gVisor alone costs ~5 ms.
	b.Run("sdk-no-spawn", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			start := time.Now()
			st, err := d.Client.Exec(context.Background(), sb.ID, sdk.ExecRequest{Cmd: []string{"no-such-command"}})
			if err != nil || st.Code != 127 {
				b.Fatal(err, st)
			}
			samples = append(samples, time.Since(start))
		}
		report(b, samples)
	})
	b.Run("runsc-exec", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			start := time.Now()
			if out, err := exec.Command(runsc, append(runscFlags(d, sb.ID), "exec", sb.ID, "/bin/true")...).CombinedOutput(); err != nil {
				b.Fatal(err, string(out))
			}
			samples = append(samples, time.Since(start))
		}
		report(b, samples)
	})
}

// BenchmarkCreate is create until the sandbox answers: through the SDK
// (create returns when the agent is connected, then one exec), and as the
// baseline `runsc run --detach` of the same bundle plus one `runsc exec`.
func BenchmarkCreate(b *testing.B) {
	d := testenv.StartDaemon(b)
	c := d.Client
	runsc := testenv.Runsc(b)
	b.Run("sdk", func(b *testing.B) {
		var samples []time.Duration
		for b.Loop() {
			start := time.Now()
			sb, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{})
			if err != nil {
				b.Fatal(err)
			}
			if st, err := c.Exec(context.Background(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || st.Code != 0 {
				b.Fatal(err, st)
			}
			samples = append(samples, time.Since(start))
			b.StopTimer()
			if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		report(b, samples)
	})
	b.Run("runsc-run", func(b *testing.B) {
		// Borrow a bundle the daemon wrote, with a plain init instead of the agent.
		tmpl, err := c.CreateSandbox(context.Background(), sdk.CreateSandboxRequest{})
		if err != nil {
			b.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(d.DataDir, "gvisor", "sandboxes", tmpl.ID, "config.json"))
		if err != nil {
			b.Fatal(err)
		}
		var spec map[string]any
		_ = json.Unmarshal(raw, &spec)
		spec["process"].(map[string]any)["args"] = []string{"/bin/sleep", "infinity"}
		spec["mounts"] = spec["mounts"].([]any)[:3] // proc, dev, sys
		var samples []time.Duration
		n := 0
		for b.Loop() {
			n++
			id := fmt.Sprintf("bench%011d", n)
			bundle := filepath.Join(testenv.TempDir(b), "bundle")
			os.MkdirAll(filepath.Join(bundle, "upper"), 0o700)
			linux := spec["linux"].(map[string]any)
			linux["cgroupsPath"] = "/clade-bench/" + id
			out, _ := json.Marshal(spec)
			os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o600)
			flags := []string{"--root", filepath.Join(bundle, "root"), "--platform", "systrap", "--network", "none", "--overlay2", "root:dir=" + filepath.Join(bundle, "upper")}
			logf, _ := os.Create(filepath.Join(bundle, "log"))
			start := time.Now()
			cmd := exec.Command(runsc, append(flags, "run", "--bundle", bundle, "--detach", id)...)
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			if o, err := exec.Command(runsc, append(flags, "exec", id, "/bin/true")...).CombinedOutput(); err != nil {
				b.Fatal(err, string(o))
			}
			samples = append(samples, time.Since(start))
			logf.Close()
			b.StopTimer()
			_ = exec.Command(runsc, append(flags, "delete", "--force", id)...).Run()
			_ = exec.Command("umount", "-l", filepath.Join(bundle, "root", "null-netns")).Run()
			b.StartTimer()
		}
		report(b, samples)
	})
}
