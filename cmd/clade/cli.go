package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/clade-sandbox/clade/sdk"
)

// host is the global --host flag: the daemon's address.
var host string

// errUsage means the arguments were wrong and the verb already said why.
var errUsage = errors.New("usage")

// usageError is wrong arguments or flags: clade says what and exits 2.
type usageError struct {
	cmd *cobra.Command
	msg string
}

func (e usageError) Error() string { return e.msg }

func usagef(cmd *cobra.Command, format string, args ...any) error {
	return usageError{cmd, fmt.Sprintf(format, args...)}
}

// multi collects a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
func (m *multi) Type() string       { return "value" }

// nargs checks the count of positional arguments: at least lo, at most hi
// (-1: any number).
func nargs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < lo:
			return usagef(cmd, "missing argument\nUsage: %s", cmd.UseLine())
		case hi >= 0 && len(args) > hi:
			return usagef(cmd, "unexpected argument %q\nUsage: %s", args[hi], cmd.UseLine())
		}
		return nil
	}
}

// withClient makes a verb's RunE from a function of a client of the
// daemon --host names.
func withClient(f func(context.Context, *sdk.Client, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := sdk.New(host)
		if err != nil {
			return err
		}
		err = f(cmd.Context(), c, args)
		if ue, ok := err.(usageError); ok && ue.cmd == nil {
			ue.cmd = cmd
			return ue
		}
		return err
	}
}

// badArg is a usage error of a verb run by withClient: an argument or
// flag value it cannot use (exit 2, like a flag cobra cannot parse).
func badArg(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}

// verb is a command with its usage line and long help.
func verb(use, long string) *cobra.Command { return &cobra.Command{Use: use, Long: long} }

// group is a verb that only holds sub-verbs: alone it shows its help and
// exits 2, with an unknown sub-verb it says so.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef(cmd, "unknown verb %q", args[0])
		}
		cmd.SetOut(cmd.ErrOrStderr())
		_ = cmd.Help()
		return errUsage
	}
	return cmd
}

const (
	groupSandbox = "sandbox"
	groupState   = "state"
	groupStore   = "store"
	groupOps     = "ops"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "clade",
		Short: "clade runs untrusted code in gVisor sandboxes",
		Long: "clade runs untrusted code in gVisor sandboxes. `clade daemon` serves the API;\n" +
			"every other verb is a client of it. ID is a sandbox id or name.",
		Example: "  clade create --name box --image python:3.12-slim\n" +
			"  clade exec box -- python3 -c 'print(6*7)'\n" +
			"  clade exec -it box -- bash\n" +
			"  clade fork box -n 8",
		Version:       versionString(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("clade {{.Version}}\n")
	root.PersistentFlags().StringVar(&host, "host", "", "daemon `address`: a unix socket path or http://HOST:PORT\n(default $CLADE_HOST, else "+sdk.DefaultSocket+")")
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError{cmd, err.Error()} })
	root.AddGroup(
		&cobra.Group{ID: groupSandbox, Title: "Sandboxes:"},
		&cobra.Group{ID: groupState, Title: "Snapshots, forks and sleep:"},
		&cobra.Group{ID: groupStore, Title: "Images, volumes and secrets:"},
		&cobra.Group{ID: groupOps, Title: "Running and watching clade:"},
	)
	// Without a verb: the help, on stderr, and exit 2.
	root.RunE = func(cmd *cobra.Command, args []string) error {
		cmd.SetOut(cmd.ErrOrStderr())
		_ = cmd.Help()
		return errUsage
	}
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [VERB...]",
		Short: "Show a verb's help",
		Args:  cobra.ArbitraryArgs,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			c, _, _ := cmd.Root().Find(args)
			var out []string
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					out = append(out, sub.Name())
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, rest, err := cmd.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return usagef(cmd, "no verb %q: see clade --help", strings.Join(args, " "))
			}
			c.SetOut(cmd.OutOrStdout())
			return c.Help()
		},
	})
	root.SetHelpCommandGroupID(groupOps)
	for _, v := range []struct {
		group string
		cmd   *cobra.Command
	}{
		{groupSandbox, newCreateCmd()}, {groupSandbox, newExecCmd()}, {groupSandbox, newListCmd()},
		{groupSandbox, newInspectCmd()}, {groupSandbox, newRemoveCmd()}, {groupSandbox, newCopyCmd()},
		{groupSandbox, newNetworkCmd()}, {groupSandbox, newTimeoutCmd()}, {groupSandbox, newPortForwardCmd()},
		{groupSandbox, newURLCmd()}, {groupSandbox, newRunCodeCmd()}, {groupSandbox, newCodeContextCmd()}, {groupSandbox, newCACmd()},
		{groupState, newSnapshotCmd()}, {groupState, newForkCmd()}, {groupState, newSleepCmd()}, {groupState, newWakeCmd()},
		{groupStore, newImageCmd()}, {groupStore, newVolumeCmd()}, {groupStore, newSecretCmd()},
		{groupOps, newDaemonCmd()}, {groupOps, newInfoCmd()}, {groupOps, newEventsCmd()}, {groupOps, newNodeCmd()}, {groupOps, newStatsCmd()}, {groupOps, newTUICmd()},
		{groupOps, newMCPCmd()}, {groupOps, newBenchCmd()}, {groupOps, newCompletionCmd()}, {groupOps, newVersionCmd()},
	} {
		v.cmd.GroupID = v.group
		root.AddCommand(v.cmd)
	}
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print clade's version",
		Example: "  clade version\n  clade --version",
		Args:    nargs(0, 0),
		Run:     func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "clade", versionString()) },
	}
}

// normalizeArgs rewrites the single-dash long flags the flag package took
// (-json, -name x) to cobra's --json, --name x, so old scripts keep
// working. Short flags (-f, -n 3, -it) and everything after "--" or, for
// exec, after the sandbox, are left alone.
func normalizeArgs(root *cobra.Command, args []string) []string {
	if len(args) > 0 && strings.HasPrefix(args[0], "__complete") {
		return args
	}
	out := make([]string, 0, len(args))
	cmd, positional := root, false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if !positional {
				if sub := findSub(cmd, a); sub != nil {
					cmd = sub
					out = append(out, a)
					continue
				}
			}
			positional = true
			if cmd.Name() == "exec" { // what follows is the command
				return append(out, args[i:]...)
			}
			out = append(out, a)
			continue
		}
		var f *pflag.Flag
		if name, _, eq := strings.Cut(strings.TrimPrefix(a, "--"), "="); strings.HasPrefix(a, "--") {
			if f = lookupFlag(cmd, name); eq {
				f = nil
			}
		} else if name, _, eq := strings.Cut(a[1:], "="); len(name) > 1 {
			if f = lookupFlag(cmd, name); f != nil || name == "help" || name == "version" {
				a = "-" + a
			}
			if eq {
				f = nil
			}
		} else if !eq {
			f = shorthandFlag(cmd, name)
		}
		out = append(out, a)
		if f != nil && f.NoOptDefVal == "" && i+1 < len(args) {
			i++ // the flag's value
			out = append(out, args[i])
		}
	}
	return out
}

func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f
	}
	for c := cmd; c != nil; c = c.Parent() {
		if f := c.PersistentFlags().Lookup(name); f != nil {
			return f
		}
	}
	return nil
}

func shorthandFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if len(name) != 1 {
		return nil
	}
	return cmd.Flags().ShorthandLookup(name)
}

// Completion of the daemon's objects, asked as the user types. A daemon
// that cannot be reached gives no candidates, quickly.

type lister func(context.Context, *sdk.Client) []string

func complete(listers ...lister) cobra.CompletionFunc {
	return completeSuffix("", listers...)
}

// completeSuffix completes names with suffix appended (e.g. ":" for
// ID:PATH), with no space after when the suffix is not empty.
func completeSuffix(suffix string, listers ...lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		dir := cobra.ShellCompDirectiveNoFileComp
		if suffix != "" {
			dir |= cobra.ShellCompDirectiveNoSpace
		}
		c, err := sdk.New(host)
		if err != nil {
			return nil, dir
		}
		var out []string
		seen := map[string]bool{}
		for _, l := range listers {
			for _, s := range l(ctx, c) {
				if s += suffix; strings.HasPrefix(s, toComplete) && !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
		return out, dir
	}
}

// firstArg completes only the first positional argument with f.
func firstArg(f cobra.CompletionFunc) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return f(cmd, args, toComplete)
	}
}

func fixedValues(vals ...string) cobra.CompletionFunc {
	return cobra.FixedCompletions(vals, cobra.ShellCompDirectiveNoFileComp)
}

var (
	completeSandboxes = complete(sandboxNames)
	completeSnapshots = complete(snapshotNames)
	completeImages    = complete(imageNames)
	completeVolumes   = complete(volumeNames)
	completeSecrets   = complete(secretNames)
)

func sandboxNames(ctx context.Context, c *sdk.Client) []string {
	sbs, _ := c.ListSandboxes(ctx)
	return namesAndIDs(sbs, func(s sdk.Sandbox) (string, string) { return s.Name, s.ID })
}

func snapshotNames(ctx context.Context, c *sdk.Client) []string {
	snaps, _ := c.ListSnapshots(ctx)
	return namesAndIDs(snaps, func(s sdk.Snapshot) (string, string) { return s.Name, s.ID })
}

// namesAndIDs lists each item's name (when it has one) and id.
func namesAndIDs[T any](items []T, of func(T) (name, id string)) []string {
	var out []string
	for _, it := range items {
		name, id := of(it)
		if name != "" {
			out = append(out, name)
		}
		out = append(out, id)
	}
	return out
}

func imageNames(ctx context.Context, c *sdk.Client) []string {
	imgs, _ := c.ListImages(ctx)
	var out []string
	for _, i := range imgs {
		out = append(out, i.Name)
		if i.Ref != "" {
			out = append(out, i.Ref)
		}
	}
	return out
}

func volumeNames(ctx context.Context, c *sdk.Client) []string {
	vs, _ := c.ListVolumes(ctx)
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

func secretNames(ctx context.Context, c *sdk.Client) []string {
	scs, _ := c.ListSecrets(ctx)
	var out []string
	for _, s := range scs {
		out = append(out, s.Name)
	}
	return out
}
