package benchkit

import "time"

// Schema names the version of the JSON layout below; bump it when a field
// changes meaning or goes away.
const Schema = "clade-bench/1"

// Result is everything one run measured: the JSON document `clade bench
// --json` writes.
type Result struct {
	Schema   string    `json:"schema"`
	Env      Env       `json:"env"`
	Config   Config    `json:"config"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Phases   []Phase   `json:"phases"`
	Canceled bool      `json:"canceled,omitempty"`
	// CleanupError is what could not be removed at the end, if anything.
	CleanupError string `json:"cleanup_error,omitempty"`
}

// Failed reports whether any phase, either side of it, or the final
// cleanup failed.
func (r *Result) Failed() bool {
	for _, p := range r.Phases {
		if p.Error != "" || p.BaselineError != "" {
			return true
		}
	}
	return r.CleanupError != "" || r.Canceled
}

// Phase is one phase's outcome. Error is clade's failure, BaselineError
// the runsc side's; each side keeps whatever it measured before failing.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// SettleSeconds is the part of Seconds spent waiting for an idle host
	// before samples; it is in no sample.
	SettleSeconds float64     `json:"settle_seconds,omitempty"`
	Error         string      `json:"error,omitempty"`
	BaselineError string      `json:"baseline_error,omitempty"`
	Latency       []Series    `json:"latency,omitempty"`
	Memfork       *Memfork    `json:"memfork,omitempty"`
	Density       *Density    `json:"density,omitempty"`
	Proxy         *Proxy      `json:"proxy,omitempty"`
	MassWake      *MassWake   `json:"mass_wake,omitempty"`
	Files         *Files      `json:"files,omitempty"`
	Storm         []StormWave `json:"storm,omitempty"`
	AtRest        *AtRest     `json:"atrest,omitempty"`
	Code          *Code       `json:"code,omitempty"`
}

// Proxy is the throughput of one download from a sandbox's HTTP server,
// through the daemon's proxy and straight to the sandbox's address.
type Proxy struct {
	// Via is "ingress", or "port-forward" on a daemon without an ingress.
	Via        string  `json:"via"`
	MiB        int     `json:"mib"`
	ViaMiBs    float64 `json:"via_mib_s"`
	DirectMiBs float64 `json:"direct_mib_s,omitempty"`
}

// MassWake is one wave of requests, one to each of Apps slept apps at
// once. Latency is from the wave's start to each app's answer, retries
// after a 503 included.
type MassWake struct {
	Apps      int    `json:"apps"`
	MemoryMiB int    `json:"memory_mib"`
	Latency   *Stats `json:"latency,omitempty"`
	// Retried apps got at least one 503 (the memory floor) first.
	Retried int `json:"retried"`
	// Failed apps never answered 200.
	Failed  int     `json:"failed"`
	Seconds float64 `json:"seconds"`
	// MemAvailableLowMiB is the host's lowest MemAvailable during the wave.
	MemAvailableLowMiB float64 `json:"mem_available_low_mib"`
}

// Series is one measured operation, e.g. "fork 16".
type Series struct {
	Name     string `json:"name"`
	Clade    *Stats `json:"clade,omitempty"`
	Baseline *Stats `json:"baseline,omitempty"`
	// Ratio is clade/baseline; present when both sides have samples.
	Ratio *Ratio `json:"ratio,omitempty"`
}

// Memfork is host memory used by the children of one fork of a sandbox
// whose background process holds touched memory.
type Memfork struct {
	Children    int       `json:"children"`
	HeldMiB     int       `json:"held_mib"`
	Clade       *MemStats `json:"clade,omitempty"`
	Baseline    *MemStats `json:"baseline,omitempty"`
	AvailRatio  float64   `json:"avail_ratio,omitempty"`  // clade/baseline of AvailPerChildMiB
	PSSRatio    float64   `json:"pss_ratio,omitempty"`    // clade/baseline of PSSPerChildMiB
	CgroupRatio float64   `json:"cgroup_ratio,omitempty"` // clade/baseline of CgroupPerChildMiB
}

// MemStats is host memory of K children on one side.
type MemStats struct {
	// AvailPerChildMiB is the fall of MemAvailable (/proc/meminfo) from
	// before the fork until every child answered, divided by the children.
	AvailPerChildMiB float64 `json:"avail_per_child_mib"`
	// PSSPerChildMiB is the summed proportional set size of the children's
	// host processes (runsc sandbox, gofer, systrap stubs) per child.
	PSSPerChildMiB float64 `json:"pss_per_child_mib"`
	// CgroupPerChildMiB is anonymous plus shared memory charged to the
	// children's memory cgroups, per child: exact even on a busy host,
	// where MemAvailable moves with everything else. 0 when the children's
	// cgroup holds other processes too (QEMU VMs run in the daemon's).
	CgroupPerChildMiB float64 `json:"cgroup_per_child_mib"`
	// ParentPSSMiB is the same sum for the forked sandbox, for scale.
	ParentPSSMiB float64 `json:"parent_pss_mib"`
	Processes    int     `json:"processes"`
	ForkMS       float64 `json:"fork_ms"`
}

// Density is how many idle sandboxes one host held.
type Density struct {
	Target    int `json:"target"`
	Reached   int `json:"reached"`
	MemoryMiB int `json:"memory_mib"`
	// StopCause is the first failure, or why the harness stopped early;
	// empty when Target was reached.
	StopCause string `json:"stop_cause,omitempty"`
	// PerSandboxMiB is the fall of MemAvailable divided by Reached.
	PerSandboxMiB float64       `json:"per_sandbox_mib"`
	Steps         []DensityStep `json:"steps"`
	Create        *Stats        `json:"create"`
	RemoveSeconds float64       `json:"remove_seconds"`
	// IdleCPUPercent is the whole host's busy CPU, in percent of all its
	// cores, over IdleSeconds while the Reached sandboxes sat idle (the
	// daemon and anything else on the host included); IdleCPUs is how
	// many cores that is.
	IdleCPUPercent float64 `json:"idle_cpu_percent"`
	IdleCPUs       float64 `json:"idle_cpus"`
	IdleSeconds    float64 `json:"idle_seconds"`
}

// DensityStep is a sample of free memory as sandboxes accumulate.
type DensityStep struct {
	Sandboxes       int     `json:"sandboxes"`
	MemAvailableMiB float64 `json:"mem_available_mib"`
	Seconds         float64 `json:"seconds"`
}
