package benchkit

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// realConfig is a small run against d with the runsc baseline.
func realConfig(t *testing.T, d *testenv.Daemon, phases ...string) Config {
	cfg := DefaultConfig()
	cfg.Phases = phases
	cfg.Samples, cfg.Warmup = 3, 1
	cfg.Baseline = true
	cfg.Runsc = testenv.Runsc(t)
	cfg.RootFS = filepath.Join(testenv.ImagesDir(t), "default", "rootfs")
	cfg.DataDir = d.DataDir
	cfg.CladeVersion = "test"
	cfg.CommandLine = []string{"clade", "bench", "--test"}
	return cfg
}

// assertClean fails if the run left sandboxes in the daemon or baseline
// files behind (the daemon's own leak census runs at its cleanup).
func assertClean(t *testing.T, d *testenv.Daemon, baselineDirsBefore []string) {
	t.Helper()
	sbs, err := d.Client.ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) > 0 {
		t.Errorf("%d sandboxes left after the run: %+v", len(sbs), sbs)
	}
	if after := baselineDirs(); len(after) != len(baselineDirsBefore) {
		t.Errorf("baseline dirs left: before %v, after %v", baselineDirsBefore, after)
	}
	if ps := testenv.ProcessesMentioning(filepath.Join(os.TempDir(), "clade-bench-")); len(ps) > 0 {
		t.Errorf("baseline processes left: %v", ps)
	}
}

func baselineDirs() []string {
	m, _ := filepath.Glob(filepath.Join(os.TempDir(), "clade-bench-*"))
	return m
}

func TestRunCreateExec(t *testing.T) {
	d := testenv.StartDaemon(t)
	before := baselineDirs()
	res, err := Run(t.Context(), d.Client, realConfig(t, d, "create", "exec"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() {
		t.Fatalf("run failed: %+v", res.Phases)
	}
	if res.Env.Engine != "gvisor" || res.Env.CPUs < 1 || res.Env.DataDirFS == "" || res.Env.MemTotalMiB <= 0 ||
		res.Env.BaselineRunscVersion == "" || len(res.Env.CommandLine) != 3 {
		t.Errorf("env block incomplete: %+v", res.Env)
	}
	if len(res.Phases) != 2 {
		t.Fatalf("%d phases, want 2", len(res.Phases))
	}
	for _, ph := range res.Phases {
		want := 1
		if ph.Name == "exec" {
			want = 2 // and the clade-only exec without a spawn
		}
		if len(ph.Latency) != want {
			t.Fatalf("%s: %d series, want %d", ph.Name, len(ph.Latency), want)
		}
		if want == 2 {
			ns := ph.Latency[1]
			// Its speed against the exec of true is the bench's figure,
			// not this test's: 3 samples on a loaded host order either way.
			if ns.Name != "exec, no spawn" || ns.Clade == nil || ns.Clade.N != 3 || ns.Baseline != nil || ns.Clade.P50 <= 0 {
				t.Errorf("exec without a spawn: %+v (exec of true: %+v)", ns, ph.Latency[0].Clade)
			}
		}
		s := ph.Latency[0]
		for side, st := range map[string]*Stats{"clade": s.Clade, "baseline": s.Baseline} {
			if st == nil || st.N != 3 || len(st.Samples) != 3 {
				t.Fatalf("%s %s: %+v, want 3 samples", ph.Name, side, st)
			}
			if st.Min <= 0 || st.Min > st.P50 || st.P50 > st.P90 || st.P90 > st.P99 || st.P99 > st.Max {
				t.Errorf("%s %s: figures out of order or not positive: %+v", ph.Name, side, st)
			}
		}
		if r := s.Ratio; r == nil || r.P50 <= 0 || r.Max <= 0 {
			t.Errorf("%s: ratio %+v", ph.Name, r)
		}
		t.Logf("%s: clade p50 %.1f ms, runsc p50 %.1f ms, ratio %.2f", ph.Name, s.Clade.P50, s.Baseline.P50, s.Ratio.P50)
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
	assertClean(t, d, before)
}

// TestRunFailures: a failing phase is reported and the run goes on; so is
// a baseline that cannot start.
func TestRunFailures(t *testing.T) {
	d := testenv.StartDaemon(t)
	before := baselineDirs()
	cfg := realConfig(t, d, "create", "exec")
	cfg.Image = "no-such-image"
	cfg.RootFS = t.TempDir() // no /bin/sh: the baseline cannot start
	res, err := Run(t.Context(), d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Failed() || len(res.Phases) != 2 {
		t.Fatalf("want 2 failed phases, got %+v", res.Phases)
	}
	for _, ph := range res.Phases {
		if !strings.Contains(ph.Error, "no-such-image") {
			t.Errorf("%s: error %q does not name the image", ph.Name, ph.Error)
		}
		if !strings.Contains(ph.BaselineError, "rootfs") {
			t.Errorf("%s: baseline error %q does not name the rootfs", ph.Name, ph.BaselineError)
		}
	}
	var b bytes.Buffer
	if err := WriteTable(&b, res); err != nil || !strings.Contains(b.String(), "failed") {
		t.Errorf("table of a failed run: %v\n%s", err, b.String())
	}
	assertClean(t, d, before)
}

// cancelAt cancels a context when the progress output shows marker.
type cancelAt struct {
	mu     sync.Mutex
	marker string
	cancel context.CancelFunc
}

func (c *cancelAt) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil && bytes.Contains(p, []byte(c.marker)) {
		c.cancel()
		c.cancel = nil
	}
	return len(p), nil
}

// TestRunInterrupted: Ctrl-C in the middle of a phase still removes what
// both sides made and reports the rest as not run.
func TestRunInterrupted(t *testing.T) {
	d := testenv.StartDaemon(t)
	before := baselineDirs()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg := realConfig(t, d, "exec", "create")
	cfg.Samples = 50
	cfg.Progress = NewProgress(&cancelAt{marker: "exec 2/", cancel: cancel}, true)
	res, err := Run(ctx, d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Canceled || !res.Failed() {
		t.Errorf("an interrupted run is not marked: canceled %v failed %v", res.Canceled, res.Failed())
	}
	if res.Phases[0].Error == "" || res.Phases[1].Error != "not run: interrupted" {
		t.Errorf("phases after Ctrl-C: %+v", res.Phases)
	}
	assertClean(t, d, before)
}

// TestRunSnapshotPhases is a smoke run of the phases built on snapshots,
// at the smallest size, with the baseline.
func TestRunSnapshotPhases(t *testing.T) {
	d := testenv.StartDaemon(t)
	before := baselineDirs()
	cfg := realConfig(t, d, "snapshot", "fork", "wake", "memfork", "density")
	cfg.Samples, cfg.Warmup = 1, 0
	cfg.Fanout = []int{2}
	cfg.MemforkMiB = 16
	cfg.Density = 2
	cfg.DensityIdle = 200 * time.Millisecond
	res, err := Run(t.Context(), d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_ = WriteTable(&b, res)
	t.Logf("\n%s", b.String())
	if res.Failed() {
		t.Fatalf("run failed")
	}
	for _, ph := range res.Phases {
		for _, s := range ph.Latency {
			if s.Clade == nil || s.Baseline == nil || s.Ratio == nil {
				t.Errorf("%s: series %s incomplete: %+v", ph.Name, s.Name, s)
			}
		}
	}
	mf := res.Phases[3].Memfork
	for side, ms := range map[string]*MemStats{"clade": mf.Clade, "baseline": mf.Baseline} {
		// Each child holds at least the 16 MiB touched before the snapshot.
		if ms == nil || ms.PSSPerChildMiB < 16 || ms.CgroupPerChildMiB < 16 || ms.Processes < 2 {
			t.Errorf("memfork %s: %+v", side, ms)
		}
	}
	if dn := res.Phases[4].Density; dn.Reached != 2 || dn.StopCause != "" || len(dn.Steps) < 2 ||
		dn.IdleSeconds < 0.2 || dn.IdleCPUPercent < 0 || dn.IdleCPUPercent > 100 || dn.IdleCPUs > float64(runtime.NumCPU()) {
		t.Errorf("density: %+v", dn)
	}
	assertClean(t, d, before)
}

// TestRunNetworkPhases runs the network phases against a daemon with
// networking and an ingress, small, and the proxy phase against one
// without an ingress (the port-forward path).
func TestRunNetworkPhases(t *testing.T) {
	d := testenv.StartDaemon(t, "--ingress", "127.0.0.1:0", "--ingress-domain", "clade.localhost")
	cfg := realConfig(t, d, "netcreate", "proxy", "proxywake", "masswake")
	cfg.Baseline = false
	cfg.Samples, cfg.Warmup = 2, 0
	cfg.ProxyMiB = 16
	cfg.MassWake, cfg.MassWakeMemoryMiB = 3, 128
	cfg.SettleMS = 0
	res, err := Run(t.Context(), d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() {
		t.Fatalf("run failed: %+v", res.Phases)
	}
	byName := map[string]Phase{}
	for _, ph := range res.Phases {
		byName[ph.Name] = ph
	}
	series := func(ph string, names ...string) {
		t.Helper()
		got := byName[ph].Latency
		if len(got) != len(names) {
			t.Fatalf("%s: %d series, want %v", ph, len(got), names)
		}
		for i, s := range got {
			if s.Name != names[i] || s.Clade == nil || s.Clade.N != 2 || s.Clade.P50 <= 0 {
				t.Errorf("%s: series %d is %q %+v, want %q with 2 positive samples", ph, i, s.Name, s.Clade, names[i])
			}
		}
	}
	series("netcreate", "create, network internet", "create, network none")
	series("proxy", "request via ingress", "request direct")
	series("proxywake", "request to a slept app via ingress")
	if p := byName["proxy"].Proxy; p == nil || p.Via != "ingress" || p.MiB != 16 || p.ViaMiBs <= 0 || p.DirectMiBs <= 0 {
		t.Errorf("proxy throughput: %+v", p)
	}
	if m := byName["masswake"].MassWake; m == nil || m.Apps != 3 || m.Failed != 0 || m.Latency == nil || m.Latency.N != 3 || m.MemAvailableLowMiB <= 0 {
		t.Errorf("masswake: %+v", m)
	}
	var table bytes.Buffer
	if err := WriteTable(&table, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"create, network internet", "proxy: a 16 MiB download", "masswake: 3 slept apps"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
	assertClean(t, d, baselineDirs())

	t.Run("port-forward", func(t *testing.T) {
		d := testenv.StartDaemon(t)
		cfg := realConfig(t, d, "proxy")
		cfg.Baseline = false
		cfg.Samples, cfg.Warmup, cfg.ProxyMiB, cfg.SettleMS = 2, 0, 16, 0
		res, err := Run(t.Context(), d.Client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Failed() {
			t.Fatalf("run failed: %+v", res.Phases)
		}
		if p := res.Phases[0].Proxy; p == nil || p.Via != "port-forward" || p.ViaMiBs <= 0 {
			t.Errorf("proxy throughput: %+v", p)
		}
		if s := res.Phases[0].Latency; len(s) != 2 || s[0].Name != "request via port-forward" {
			t.Errorf("series: %+v", s)
		}
		assertClean(t, d, baselineDirs())
	})
}

// TestRunClaimFilesStorm runs the claim, files and storm phases, small,
// against a real daemon with a hot pool: every claim sample is taken, the
// transfers move and count real bytes, every storm client succeeds, and
// nothing is left behind.
func TestRunClaimFilesStorm(t *testing.T) {
	d := testenv.StartDaemon(t, "--hot-pool", "1")
	before := baselineDirs()
	cfg := realConfig(t, d, "claim", "files", "storm")
	cfg.Samples, cfg.Warmup = 2, 0
	cfg.FilesMiB, cfg.FilesSmall = 8, 50
	cfg.StormWidths = []int{2, 4}
	res, err := Run(t.Context(), d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() {
		t.Fatalf("run failed: %+v", res.Phases)
	}
	claim := res.Phases[0]
	if len(claim.Latency) != 2 || claim.Latency[0].Name != "claim" || claim.Latency[0].Clade == nil || claim.Latency[0].Clade.N != 2 ||
		claim.Latency[1].Clade.P50 < claim.Latency[0].Clade.P50 {
		t.Fatalf("claim: %+v", claim.Latency)
	}
	if f := res.Phases[1].Files; f == nil || f.PushMiBs <= 0 || f.PullMiBs <= 0 || f.PushFilesPS <= 0 || f.PullFilesPS <= 0 || f.SmallFiles != 50 {
		t.Fatalf("files: %+v", res.Phases[1].Files)
	}
	st := res.Phases[2].Storm
	if len(st) != 2 || st[0].Width != 2 || st[1].Width != 4 || st[1].Failed != 0 || st[1].Latency == nil || st[1].Latency.N != 4 {
		t.Fatalf("storm: %+v", st)
	}
	t.Logf("claim p50 %.2f ms; files %+v; storm 4: %+v", claim.Latency[0].Clade.P50, *res.Phases[1].Files, st[1])
	assertClean(t, d, before)
}

// TestRunAtrest runs the atrest phase, small, against a daemon without
// encryption and one with --encrypt-at-rest side by side.
func TestRunAtrest(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	d := testenv.StartDaemon(t)
	enc := testenv.StartDaemon(t, "--encrypt-at-rest")
	cfg := realConfig(t, d, "atrest")
	cfg.Baseline = false
	cfg.Samples, cfg.Warmup = 1, 0
	cfg.SettleMS = 0
	// What the phase measures, not how much: 512 MiB written and read
	// three times, 16 children a fork, took minutes here.
	cfg.AtRestMiB, cfg.AtRestFanout = 32, 4
	if err := cfg.Validate(); err == nil {
		t.Fatal("atrest without --encrypted-host validated")
	}
	cfg.EncryptedHost = enc.Socket
	res, err := Run(t.Context(), d.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_ = WriteTable(&b, res)
	t.Logf("\n%s", b.String())
	if res.Failed() {
		t.Fatalf("run failed: %+v", res.Phases)
	}
	ph := res.Phases[0]
	if len(ph.Latency) != 6 {
		t.Fatalf("atrest series: %+v, want wake, fork, write, read, and write, read of a volume with its own key", ph.Latency)
	}
	for _, s := range ph.Latency {
		if s.Clade == nil || s.Baseline == nil || s.Ratio == nil {
			t.Errorf("series %s incomplete: %+v", s.Name, s)
		}
	}
	if a := ph.AtRest; a == nil || a.EncWriteMiBs <= 0 || a.PlainWriteMiBs <= 0 || a.EncReadMiBs <= 0 || a.PlainReadMiBs <= 0 || a.VolKeyWriteMiBs <= 0 || a.VolKeyReadMiBs <= 0 {
		t.Errorf("throughput: %+v", ph.AtRest)
	}
	for _, dd := range []*testenv.Daemon{d, enc} {
		if sbs, err := dd.Client.ListSandboxes(t.Context()); err != nil || len(sbs) > 0 {
			t.Errorf("sandboxes left: %+v %v", sbs, err)
		}
		if vols, err := dd.Client.ListVolumes(t.Context()); err != nil || len(vols) > 0 {
			t.Errorf("volumes left: %+v %v", vols, err)
		}
	}
}
