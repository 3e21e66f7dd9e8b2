package system

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

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
		return qemu.New(qemu.Config{StateDir: filepath.Join(o.DataDir, "qemu"), AgentPath: o.AgentPath, Log: log, TCGCacheMiB: o.QEMUTCGCacheMiB})
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

func newEngine(o Options, log *slog.Logger) (engine.Engine, error) {
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
	// The other engines serve beside the default one (clade create
	// --engine) when this host has what they need; one that cannot start
	// here (e.g. no QEMU installed) is left out with a note in the log.
	all := map[string]engine.Engine{name: def}
	for _, n := range Engines() {
		if n == name {
			continue
		}
		eng, err := engines[n](o, log)
		if err != nil {
			log.Info("engine not available", "engine", n, "why", err)
			continue
		}
		all[n] = eng
	}
	if len(all) == 1 {
		return def, nil
	}
	return multi.New(name, all)
}

// engineVersion is the engine's version for /v1/health, if it tells one.
func engineVersion(ctx context.Context, eng engine.Engine) string {
	if v, ok := eng.(interface{ Version(context.Context) string }); ok {
		return v.Version(ctx)
	}
	return ""
}
