// Command clade is the clade sandbox runtime: `clade daemon` serves the API,
// every other verb is a client of it through the Go SDK.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func versionString() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}

// exitError carries a process exit code out of a verb.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// stopSignals ends the root context's signal handling; exec calls it
// because it forwards signals itself.
var stopSignals = func() {}

// signalsStopped is set once stopSignals ran.
var signalsStopped bool

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	signalsStopped = false
	stopSignals = func() { signalsStopped = true; stop() }
	root := newRoot()
	root.SetArgs(normalizeArgs(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	// stop (exec's stopSignals) also cancels ctx: only a signal counts.
	interrupted := ctx.Err() != nil && !signalsStopped
	if err != nil && interrupted && !errors.As(err, new(exitError)) && !errors.As(err, new(usageError)) {
		// Ctrl-C cut a call short: say so, not `Post "http://clade/...":
		// interrupt signal received`. A create or fork the daemon finishes
		// after that is removed by it, since no one learned its ids.
		fmt.Fprintln(os.Stderr, "clade: interrupted")
		return 130
	}
	return exitCode(cmd, err)
}

// exitCode prints err as the user should see it and says what clade exits with.
func exitCode(cmd *cobra.Command, err error) int {
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%s: %s\n", ue.cmd.CommandPath(), ue.msg)
		fmt.Fprintf(os.Stderr, "Run '%s --help' for usage.\n", ue.cmd.CommandPath())
		return 2
	case strings.HasPrefix(err.Error(), "unknown command "):
		// cobra's, for an unknown verb or sub-verb.
		path := "clade"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		// `unknown command "x" for "clade"` and maybe suggestions.
		msg := strings.TrimPrefix(err.Error(), "unknown command ")
		name, rest, _ := strings.Cut(msg, " for ")
		if _, sugg, ok := strings.Cut(rest, "\n"); ok {
			name += "\n" + strings.TrimSpace(sugg)
		}
		fmt.Fprintf(os.Stderr, "%s: unknown verb %s\nRun '%s --help' for the verbs.\n", path, name, path)
		return 2
	default:
		fmt.Fprintln(os.Stderr, "clade:", err)
		return 1
	}
}
