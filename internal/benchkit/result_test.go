package benchkit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleResult has every part of the schema filled in.
func sampleResult() *Result {
	st := Summarize([]time.Duration{10 * time.Millisecond, 12 * time.Millisecond})
	bs := Summarize([]time.Duration{8 * time.Millisecond, 9 * time.Millisecond})
	return &Result{
		Schema: Schema,
		Env: Env{Hostname: "h", CPUModel: "cpu", CPUs: 2, Kernel: "Linux 6", MemTotalMiB: 1024, LoadAvg: "0.1 0.2 0.3", DaemonVersion: "v",
			Engine: "gvisor", Runsc: "runsc version x", CladeVersion: "v", CladeCommit: "abc", GoVersion: "go1.26",
			DataDir: "/var/lib/clade", DataDirFS: "ext4", BaselineRunsc: "/bin/runsc", BaselineRunscVersion: "x",
			CommandLine: []string{"clade", "bench", "--baseline"}},
		Config:  func() Config { c := DefaultConfig(); c.Baseline = true; return c }(),
		Started: time.Unix(0, 0).UTC(),
		Seconds: 1,
		Phases: []Phase{
			{Name: "create", Seconds: 1, SettleSeconds: 0.5, Latency: []Series{{Name: "create", Clade: st, Baseline: bs, Ratio: Ratios(st, bs)}}},
			{Name: "snapshot", Error: "snapshot x: no such endpoint", BaselineError: "runsc checkpoint: boom"},
			{Name: "memfork", Memfork: &Memfork{Children: 16, HeldMiB: 64,
				Clade:      &MemStats{AvailPerChildMiB: 80, PSSPerChildMiB: 90, CgroupPerChildMiB: 85, ParentPSSMiB: 88, Processes: 40, ForkMS: 2000},
				Baseline:   &MemStats{AvailPerChildMiB: 80, PSSPerChildMiB: 90, CgroupPerChildMiB: 85, ParentPSSMiB: 88, Processes: 40, ForkMS: 2000},
				AvailRatio: 1, PSSRatio: 1, CgroupRatio: 1}},
			{Name: "density", Density: &Density{Target: 10, Reached: 7, MemoryMiB: 64, StopCause: "unavailable",
				PerSandboxMiB: 15, Steps: []DensityStep{{Sandboxes: 0, MemAvailableMiB: 1000}}, Create: st, RemoveSeconds: 1}},
			{Name: "proxy", Proxy: &Proxy{Via: "ingress", MiB: 1024, ViaMiBs: 150, DirectMiBs: 180}},
			{Name: "masswake", MassWake: &MassWake{Apps: 20, MemoryMiB: 256, Latency: st, Retried: 1, Failed: 0, Seconds: 2, MemAvailableLowMiB: 900}},
			{Name: "files", Files: &Files{LargeMiB: 1024, PushMiBs: 500, PullMiBs: 600, SmallFiles: 10000, SmallKiB: 4, PushFilesPS: 3000, PullFilesPS: 4000, PushSmallMiB: 12}},
			{Name: "storm", Storm: []StormWave{{Width: 16, Seconds: 3, PerSecond: 5, Latency: st, Deferred: 2, Retried: 1, Failed: 1, FirstError: "boom"}}},
		},
	}
}

func keys(t *testing.T, v any) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v is not an object", v)
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func wantKeys(t *testing.T, what string, v any, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := keys(t, v); !slices.Equal(got, want) {
		t.Errorf("%s fields:\n got  %v\n want %v\n(a changed field is a schema change: bump Schema and update docs/bench.md)", what, got, want)
	}
}

// TestSchema pins the JSON field names: tools read these files, so a
// rename must be deliberate.
func TestSchema(t *testing.T) {
	b, err := json.Marshal(sampleResult())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["schema"] != "clade-bench/1" {
		t.Errorf("schema = %v", doc["schema"])
	}
	wantKeys(t, "result", doc, "schema", "env", "config", "started", "seconds", "phases")
	wantKeys(t, "env", doc["env"], "hostname", "cpu_model", "cpus", "kernel", "mem_total_mib", "load_avg", "daemon_version", "engine",
		"runsc", "clade_version", "clade_commit", "go_version", "data_dir", "data_dir_fs", "reflink", "baseline_runsc",
		"baseline_runsc_version", "command_line")
	wantKeys(t, "config", doc["config"], "phases", "fanout", "samples", "warmup", "density", "density_memory_mib",
		"memfork_mib", "settle_ms", "baseline", "rootfs", "data_dir", "proxy_mib", "mass_wake", "mass_wake_memory_mib", "storm_widths", "files_mib", "files_small")
	if doc["config"].(map[string]any)["baseline"] != true {
		t.Error("config.baseline lost")
	}
	phases := doc["phases"].([]any)
	wantKeys(t, "phase", phases[0], "name", "seconds", "settle_seconds", "latency")
	wantKeys(t, "failed phase", phases[1], "name", "seconds", "error", "baseline_error")
	series := phases[0].(map[string]any)["latency"].([]any)[0].(map[string]any)
	wantKeys(t, "series", series, "name", "clade", "baseline", "ratio")
	wantKeys(t, "stats", series["clade"], "n", "min_ms", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "samples_ms")
	wantKeys(t, "ratio", series["ratio"], "p50", "p90", "p99", "max")
	mf := phases[2].(map[string]any)["memfork"]
	wantKeys(t, "memfork", mf, "children", "held_mib", "clade", "baseline", "avail_ratio", "pss_ratio", "cgroup_ratio")
	wantKeys(t, "memstats", mf.(map[string]any)["clade"], "avail_per_child_mib", "pss_per_child_mib",
		"cgroup_per_child_mib", "parent_pss_mib", "processes", "fork_ms")
	dn := phases[3].(map[string]any)["density"]
	wantKeys(t, "density", dn, "target", "reached", "memory_mib", "stop_cause", "per_sandbox_mib", "steps", "create", "remove_seconds",
		"idle_cpu_percent", "idle_cpus", "idle_seconds")
	wantKeys(t, "density step", dn.(map[string]any)["steps"].([]any)[0], "sandboxes", "mem_available_mib", "seconds")
	wantKeys(t, "proxy", phases[4].(map[string]any)["proxy"], "via", "mib", "via_mib_s", "direct_mib_s")
	wantKeys(t, "files", phases[6].(map[string]any)["files"], "large_mib", "push_mib_s", "pull_mib_s", "small_files", "small_kib",
		"push_files_s", "pull_files_s", "push_small_mib_s")
	wantKeys(t, "storm wave", phases[7].(map[string]any)["storm"].([]any)[0], "width", "seconds", "per_second", "latency", "deferred",
		"retried", "failed", "first_error")
	wantKeys(t, "masswake", phases[5].(map[string]any)["mass_wake"], "apps", "memory_mib", "latency", "retried", "failed", "seconds", "mem_available_low_mib")

	// And it reads back into the same thing.
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Phases[0].Latency[0].Ratio.P50 != sampleResult().Phases[0].Latency[0].Ratio.P50 || back.Env.CommandLine[2] != "--baseline" {
		t.Errorf("round trip lost data: %+v", back)
	}
}

func TestFailed(t *testing.T) {
	r := sampleResult()
	if !r.Failed() {
		t.Error("a result with a failed phase is not Failed")
	}
	r.Phases = r.Phases[:1]
	if r.Failed() {
		t.Error("a clean result is Failed")
	}
	r.Phases[0].BaselineError = "x"
	if !r.Failed() {
		t.Error("a failed baseline does not fail the run")
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"host     h: cpu, 2 CPUs", "data dir /var/lib/clade: ext4, reflink no", "create ", "1.33x",
		"snapshot", "failed", "snapshot: snapshot x: no such endpoint", "snapshot (baseline): runsc checkpoint: boom",
		"memfork: 16 children", "density: 7 of 10", "stopped: unavailable", "clade bench --baseline"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestProgress(t *testing.T) {
	var plain, tty bytes.Buffer
	for _, p := range []*Progress{NewProgress(&plain, false), NewProgress(&tty, true)} {
		p.Update("a 1/3")
		p.Update("a 2/3") // dropped when not on a terminal: too soon after the last line
		p.Log("a done")
		p.Clear()
	}
	if plain.String() != "a 1/3\na done\n" {
		t.Errorf("plain progress = %q", plain.String())
	}
	if tty.String() != "\r\x1b[Ka 1/3\r\x1b[Ka 2/3\r\x1b[Ka done\n" {
		t.Errorf("terminal progress = %q", tty.String())
	}
	var nilp *Progress
	nilp.Update("x") // silent, no panic
	nilp.Log("x")
}

func TestProbeFS(t *testing.T) {
	dir := t.TempDir()
	fs, _, note := probeFS(dir)
	if fs == "" || fs == "unknown" {
		t.Errorf("probeFS(%s) = %q, %q", dir, fs, note)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("the reflink probe left %d files", len(ents))
	}
	_, _, note = probeFS(filepath.Join(dir, "missing", "deeper"))
	if !strings.Contains(note, "probed "+dir) {
		t.Errorf("a missing dir should be probed at its parent: note %q", note)
	}
}
