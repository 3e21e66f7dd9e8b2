// Package benchkit is the harness behind `clade bench`: latency and memory
// phases driven through the SDK, the same work done with plain runsc
// commands as a baseline in the same run, percentile statistics, an
// environment block, and a JSON result with a stable schema. Figures are
// one machine's; the clade/baseline ratios are what travels.
package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// Phases are the phase names, in the order a default run takes them.
var Phases = []string{"create", "claim", "exec", "snapshot", "fork", "wake", "memfork", "density", "volwake", "netcreate", "proxy", "proxywake", "masswake", "files", "storm"}

// OptionalPhases run only when asked for: they need more than one daemon
// (atrest: a second one with --encrypt-at-rest, Config.EncryptedHost) or
// an image built ahead (code: the code-interpreter image, minutes to build).
var OptionalPhases = []string{"atrest", "code"}

// Config is one run's settings; DefaultConfig has the defaults.
type Config struct {
	Phases  []string `json:"phases"`
	Fanout  []int    `json:"fanout"`
	Samples int      `json:"samples"`
	Warmup  int      `json:"warmup"`
	// Density is how many idle sandboxes the density phase aims for.
	Density int    `json:"density"`
	Image   string `json:"image,omitempty"`
	// Engine runs every sandbox in this engine ("" the daemon's default).
	Engine string `json:"engine,omitempty"`
	// MemoryMiB is the limit of every sandbox but density's; 0 leaves the
	// daemon's default (512). The daemon admits a fork only if all its
	// children could grow to their limit, so wide forks need small limits.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// DensityMemoryMiB is the limit of the density phase's idle sandboxes.
	DensityMemoryMiB int `json:"density_memory_mib"`
	// DensityIdle is how long the density phase watches the host's CPU
	// with its sandboxes idle (after half as long again to settle); 0 is
	// 10 s.
	DensityIdle time.Duration `json:"density_idle_ns,omitempty"`
	// MemforkChildren is K for memfork; 0 takes the largest fan-out <= 16.
	MemforkChildren int `json:"memfork_children,omitempty"`
	MemforkMiB      int `json:"memfork_mib"`
	// ProxyMiB is the size of the proxy phase's download.
	ProxyMiB int `json:"proxy_mib"`
	// MassWake is how many slept apps the masswake phase wakes at once,
	// each with a MassWakeMemoryMiB limit.
	MassWake          int `json:"mass_wake"`
	MassWakeMemoryMiB int `json:"mass_wake_memory_mib"`
	// StormWidths are the storm phase's waves: that many creates (each
	// with an exec) sent at once, with DensityMemoryMiB sandboxes.
	StormWidths []int `json:"storm_widths"`
	// FilesMiB is the files phase's large file, FilesSmall how many 4 KiB
	// files follow it.
	FilesMiB   int `json:"files_mib"`
	FilesSmall int `json:"files_small"`
	// AtRestMiB is the atrest phase's volume write and read (0: 512);
	// AtRestFanout its fork's width (0: 16). Tests make them small.
	AtRestMiB    int `json:"atrest_mib,omitempty"`
	AtRestFanout int `json:"atrest_fanout,omitempty"`
	// EncryptedHost addresses a second daemon, started with
	// --encrypt-at-rest, for the atrest phase (a socket path or URL).
	EncryptedHost string `json:"encrypted_host,omitempty"`
	Baseline      bool   `json:"baseline"`
	Runsc         string `json:"runsc,omitempty"`
	RootFS        string `json:"rootfs,omitempty"`
	DataDir       string `json:"data_dir"`
	// SettleMS bounds the wait before each sample for the daemon's and the
	// baseline's processes to go idle (see settle); 0 skips it.
	SettleMS int `json:"settle_ms"`
	// SampleTimeout bounds one sample, so a hung daemon fails the phase
	// instead of the run.
	SampleTimeout time.Duration `json:"-"`

	CladeVersion string    `json:"-"` // goes to Env
	CommandLine  []string  `json:"-"` // goes to Env
	Progress     *Progress `json:"-"`
}

const (
	// daemonMemoryMiB and daemonCPUs are the daemon's defaults, which the
	// baseline's bundles copy when --memory is not given.
	daemonMemoryMiB = 512
	daemonCPUs      = 1
)

// DefaultConfig returns the defaults of `clade bench`.
func DefaultConfig() Config {
	return Config{
		Phases:  slices.Clone(Phases),
		Fanout:  []int{1, 4, 16, 64},
		Samples: 30,
		Warmup:  5,
		Density: 100,
		// Idle sandboxes: the smallest limit a sandbox boots with.
		DensityMemoryMiB:  64,
		MemforkMiB:        64,
		ProxyMiB:          1024,
		MassWake:          20,
		MassWakeMemoryMiB: 256,
		StormWidths:       []int{16, 64, 256},
		FilesMiB:          1024,
		FilesSmall:        10000,
		SettleMS:          5000,
		RootFS:            "/var/cache/clade/images/default/rootfs",
		DataDir:           "/var/lib/clade",
		SampleTimeout:     10 * time.Minute,
	}
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	if len(c.Phases) == 0 {
		return errors.New("no phases: use --phases " + strings.Join(Phases, ","))
	}
	for i, p := range c.Phases {
		if p == "encryption" { // the name for it
			p, c.Phases[i] = "atrest", "atrest"
		}
		if !slices.Contains(Phases, p) && !slices.Contains(OptionalPhases, p) {
			return fmt.Errorf("unknown phase %q: use some of %s", p, strings.Join(append(slices.Clone(Phases), OptionalPhases...), ","))
		}
	}
	if slices.Contains(c.Phases, "atrest") && c.EncryptedHost == "" {
		return errors.New("atrest needs a second daemon started with --encrypt-at-rest: pass its socket with --encrypted-host")
	}
	if c.Samples < 1 || c.Warmup < 0 {
		return fmt.Errorf("need --samples >= 1 and --warmup >= 0")
	}
	if len(c.Fanout) == 0 && (slices.Contains(c.Phases, "fork") || slices.Contains(c.Phases, "memfork")) {
		return errors.New("fork and memfork need --fanout")
	}
	for _, n := range c.Fanout {
		if n < 1 {
			return fmt.Errorf("bad fan-out %d: use widths >= 1", n)
		}
	}
	if slices.Contains(c.Phases, "density") && (c.Density < 1 || c.DensityMemoryMiB < 1) {
		return errors.New("density needs --density N >= 1 and --density-memory MIB >= 1")
	}
	if slices.Contains(c.Phases, "proxy") && c.ProxyMiB < 1 {
		return errors.New("proxy needs --proxy-mib >= 1")
	}
	if slices.Contains(c.Phases, "masswake") && (c.MassWake < 1 || c.MassWakeMemoryMiB < 1) {
		return errors.New("masswake needs --masswake N >= 1 and --masswake-memory MIB >= 1")
	}
	if slices.Contains(c.Phases, "storm") {
		if len(c.StormWidths) == 0 || slices.Min(c.StormWidths) < 1 {
			return errors.New("storm needs widths >= 1")
		}
	}
	if slices.Contains(c.Phases, "files") && (c.FilesMiB < 1 || c.FilesSmall < 1) {
		return errors.New("files needs a large file >= 1 MiB and >= 1 small file")
	}
	if c.MemforkMiB < 1 {
		return errors.New("memfork needs a held size >= 1 MiB")
	}
	if c.Baseline && c.Runsc == "" {
		return errors.New("--baseline needs runsc: run `make deps` or set --runsc")
	}
	return nil
}

func (c *Config) memforkChildren() int {
	if c.MemforkChildren > 0 {
		return c.MemforkChildren
	}
	k := slices.Min(c.Fanout)
	for _, n := range c.Fanout {
		if n <= 16 && n > k {
			k = n
		}
	}
	return k
}

// runner holds one run's state.
type runner struct {
	cfg   Config
	c     *sdk.Client
	prog  *Progress
	clade *cladeTarget
	base  *runscTarget // nil without --baseline or when it could not start
	// enc is the daemon with --encrypt-at-rest (atrest), nil without
	// Config.EncryptedHost.
	enc *cladeTarget
	// settled is the time settle waited in the current phase.
	settled time.Duration
}

// targets returns clade and the baseline (nil when absent) at fixed
// positions, so results land on the right side.
func (r *runner) targets() [2]target {
	t := [2]target{r.clade}
	if r.base != nil {
		t[1] = r.base
	}
	return t
}

// Run runs cfg's phases against the daemon behind c and returns what they
// measured. A phase that fails is recorded in its Phase and the run goes
// on; everything a phase made is removed when it ends, and whatever is
// left (an interrupted create, say) when the run ends, also after ctx is
// cancelled. The error is for a run that could not start: bad settings or
// an unreachable daemon.
func Run(ctx context.Context, c *sdk.Client, cfg Config) (*Result, error) {
	if cfg.SampleTimeout == 0 {
		cfg.SampleTimeout = DefaultConfig().SampleTimeout
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env, err := collectEnv(ctx, c, cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Schema: Schema, Env: env, Config: cfg, Started: time.Now().UTC()}
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	r := &runner{cfg: cfg, c: c, prog: cfg.Progress,
		clade: &cladeTarget{c: c, image: cfg.Image, memoryMiB: cfg.MemoryMiB, engine: cfg.Engine, prefix: "bench-" + hex.EncodeToString(tag[:])}}
	if cfg.EncryptedHost != "" {
		ec, err := sdk.New(cfg.EncryptedHost)
		if err != nil {
			return nil, fmt.Errorf("--encrypted-host: %w", err)
		}
		if _, err := ec.Health(ctx); err != nil {
			return nil, fmt.Errorf("--encrypted-host %s: %w", cfg.EncryptedHost, err)
		}
		r.enc = &cladeTarget{c: ec, image: cfg.Image, memoryMiB: cfg.MemoryMiB, engine: cfg.Engine, prefix: r.clade.prefix}
	}
	var baseErr error
	if cfg.Baseline {
		mem := orDefault(cfg.MemoryMiB, daemonMemoryMiB)
		if r.base, baseErr = newRunscTarget(cfg.Runsc, cfg.RootFS, mem, daemonCPUs); baseErr != nil {
			baseErr = fmt.Errorf("baseline: %w", baseErr)
			r.prog.Log("%v", baseErr)
		}
	}
	// Cleanup must outlive a cancelled run, but not hang forever.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	}
	for _, name := range cfg.Phases {
		ph := Phase{Name: name}
		if ctx.Err() != nil {
			ph.Error = "not run: interrupted"
			res.Phases = append(res.Phases, ph)
			continue
		}
		r.prog.Log("%s ...", name)
		start := time.Now()
		r.settled = 0
		phaseFuncs[name](r, ctx, &ph)
		ph.SettleSeconds = round3(r.settled.Seconds())
		if baseErr != nil && !noBaseline[name] {
			ph.BaselineError = baseErr.Error()
		}
		cctx, cancel := cleanupCtx()
		if err := r.clade.cleanup(cctx); err != nil {
			ph.Error = joinMsg(ph.Error, "cleanup: "+err.Error())
		}
		if r.base != nil {
			if err := r.base.cleanup(cctx); err != nil {
				ph.BaselineError = joinMsg(ph.BaselineError, "cleanup: "+err.Error())
			}
		}
		cancel()
		ph.Seconds = round3(time.Since(start).Seconds())
		res.Phases = append(res.Phases, ph)
		r.prog.Log("%s", phaseSummary(ph))
	}
	if ctx.Err() != nil {
		r.prog.Log("interrupted: removing everything the run made")
	}
	cctx, cancel := cleanupCtx()
	defer cancel()
	var errs []error
	errs = append(errs, r.clade.sweep(cctx))
	if r.enc != nil {
		errs = append(errs, r.enc.sweep(cctx))
	}
	if r.base != nil {
		errs = append(errs, r.base.close(cctx))
	}
	if err := errors.Join(errs...); err != nil {
		res.CleanupError = err.Error()
	}
	// Read again at the end: an engine may say more once it has run
	// sandboxes (QEMU picks KVM or TCG at its first VM start).
	if h, err := c.Health(cctx); err == nil && h.EngineVersion != "" {
		res.Env.Runsc = h.EngineVersion
	}
	res.Canceled = ctx.Err() != nil
	res.Seconds = round3(time.Since(res.Started).Seconds())
	r.prog.Clear()
	return res, nil
}

// noBaseline are the phases without a plain-runsc side.
var noBaseline = map[string]bool{"atrest": true, "code": true, "claim": true, "files": true, "storm": true, "density": true, "netcreate": true, "proxy": true, "proxywake": true, "masswake": true}

var phaseFuncs = map[string]func(*runner, context.Context, *Phase){
	"create":    (*runner).phaseCreate,
	"claim":     (*runner).phaseClaim,
	"exec":      (*runner).phaseExec,
	"snapshot":  (*runner).phaseSnapshot,
	"fork":      (*runner).phaseFork,
	"wake":      (*runner).phaseWake,
	"memfork":   (*runner).phaseMemfork,
	"density":   (*runner).phaseDensity,
	"netcreate": (*runner).phaseNetcreate,
	"proxy":     (*runner).phaseProxy,
	"proxywake": (*runner).phaseProxywake,
	"masswake":  (*runner).phaseMasswake,
	"volwake":   (*runner).phaseVolwake,
	"files":     (*runner).phaseFiles,
	"storm":     (*runner).phaseStorm,
	"atrest":    (*runner).phaseAtrest,
	"code":      (*runner).phaseCode,
}

// orDefault returns v, or def when v is 0.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// record adds each side's error to the phase.
func (ph *Phase) record(errs [2]error) {
	if errs[0] != nil {
		ph.Error = joinMsg(ph.Error, errs[0].Error())
	}
	if errs[1] != nil {
		ph.BaselineError = joinMsg(ph.BaselineError, errs[1].Error())
	}
}

// phaseSummary is the line the progress log keeps for a finished phase.
func phaseSummary(ph Phase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %.1fs", ph.Name, ph.Seconds)
	for _, s := range ph.Latency {
		if s.Clade != nil {
			fmt.Fprintf(&b, ", %s p50 %.1f ms", s.Name, s.Clade.P50)
		}
		if s.Ratio != nil {
			fmt.Fprintf(&b, " (%.2fx)", s.Ratio.P50)
		}
	}
	if ph.Error != "" {
		fmt.Fprintf(&b, ", FAILED: %s", ph.Error)
	}
	if ph.BaselineError != "" {
		fmt.Fprintf(&b, ", baseline FAILED: %s", ph.BaselineError)
	}
	return b.String()
}
