package system

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/engine/multi"
	"github.com/clade-sandbox/clade/internal/engine/qemu"
)

// engines maps an engine's name to its constructor: the one place a new
// engine is registered. Each keeps its state under DATA-DIR/<name>.
var engines = map[string]func(o Options, log *slog.Logger) (engine.Engine, error){
	"gvisor": func(o Options, log *slog.Logger) (engine.Engine, error) {
		return gvisor.New(gvisor.Config{StateDir: filepath.Join(o.DataDir, "gvisor"), Runsc: o.Runsc, AgentPath: o.AgentPath, Log: log,
			UpperRoot: o.upperRoot, CrashAt: o.Sandbox.CrashAt})
	},
	"qemu": func(o Options, log *slog.Logger) (engine.Engine, error) {
		return qemu.New(qemu.Config{StateDir: filepath.Join(o.DataDir, "qemu"), AgentPath: o.AgentPath, Log: log, TCGCacheMiB: o.QEMUTCGCacheMiB,
			QEMU: o.QEMU, KernelDir: o.QEMUKernelDir})
	},
}

// Engines returns the names of the engines this binary has.
func Engines() []string {
	names := make([]string, 0, len(engines))
	for n := range engines {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// checkpointKinds recognise an engine's checkpoints without the engine,
// so a host that lacks it refuses their restores instead of handing them
// to another engine.
var checkpointKinds = map[string]func(dir string) bool{
	"qemu": qemu.IsCheckpoint,
}

// newEngine makes the default engine and, beside it, every other engine
// this host can run. It always answers a multi.Engine, so a sandbox that
// names an engine this host lacks is refused with what is missing, never
// run by another one.
func newEngine(o Options, log *slog.Logger) (*multi.Engine, error) {
	name := o.Engine
	if name == "" {
		name = "gvisor"
	}
	mk, ok := engines[name]
	if !ok {
		return nil, fmt.Errorf("unknown engine %q: use one of %s", name, strings.Join(Engines(), ", "))
	}
	def, err := mk(o, log)
	if err != nil {
		return nil, err
	}
	all := map[string]engine.Engine{name: def}
	missing := map[string]multi.Missing{}
	for _, n := range Engines() {
		if n == name {
			continue
		}
		eng, err := engines[n](o, log)
		if err != nil {
			log.Warn("engine not available: sandboxes asking for it are refused", "engine", n, "why", err)
			missing[n] = multi.Missing{Why: err, IsCheckpoint: checkpointKinds[n]}
			continue
		}
		all[n] = eng
	}
	return multi.New(name, all, missing)
}

// engineStatuses is eng's engines as /v1/health reports them.
func engineStatuses(eng *multi.Engine) []api.EngineStatus {
	var out []api.EngineStatus
	for _, st := range eng.Statuses() {
		out = append(out, api.EngineStatus{Name: st.Name, Default: st.Default, Available: st.Available, Reason: st.Why})
	}
	return out
}

// engineVersion is the engine's version for /v1/health, if it tells one.
func engineVersion(ctx context.Context, eng engine.Engine) string {
	if v, ok := eng.(interface{ Version(context.Context) string }); ok {
		return v.Version(ctx)
	}
	return ""
}
