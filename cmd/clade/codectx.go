package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/clade-sandbox/clade/sdk"
	"github.com/spf13/cobra"
)

// newCodeContextCmd is `clade code-context`: the contexts (one kernel
// each) of a sandbox's code interpreter.
func newCodeContextCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "code-context VERB",
		Aliases: []string{"code-contexts"},
		Short:   "List, create, restart and remove a sandbox's code interpreter contexts",
		Long: "A context of a sandbox's code interpreter (see run-code) is one kernel with its own state:\n" +
			"python, bash and js each have a default context (its ID is the language's name), and more\n" +
			"can be created. A context whose kernel died (os._exit, killed, out of memory), or that was\n" +
			"restarted after a run that would not stop at its timeout, loses its state; restart gives it\n" +
			"a new kernel under the same ID.",
		Example: "  clade code-context ls nb\n" +
			"  clade code-context create nb --lang python          # prints the new context's ID\n" +
			"  clade run-code nb --context ID -c 'x = 1'\n" +
			"  clade code-context restart nb python                # a new kernel: state cleared\n" +
			"  clade code-context rm nb ID",
	})
	cmd.AddCommand(newCodeContextListCmd(), newCodeContextCreateCmd(), newCodeContextRestartCmd(), newCodeContextRemoveCmd())
	return cmd
}

func newCodeContextListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "ls SANDBOX [flags]",
		Aliases:           []string{"list"},
		Short:             "List a sandbox's code contexts",
		Example:           "  clade code-context ls nb\n  clade code-context ls nb --json",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		list, err := c.CodeContexts(ctx, args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(list)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD")
		for _, x := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", x.ID, x.Language, x.Cwd)
		}
		return tw.Flush()
	})
	return cmd
}

func newCodeContextCreateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "create SANDBOX [--lang python|bash|js] [--cwd DIR]",
		Short:             "Start a new code context (a kernel of its own) and print its ID",
		Example:           "  clade code-context create nb\n  clade code-context create nb --lang bash --cwd /tmp",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	lang := cmd.Flags().String("lang", "", "the context's `language`: python (default), bash or js")
	cwd := cmd.Flags().String("cwd", "", "the kernel's working `DIR`, absolute (default the sandbox user's home)")
	_ = cmd.RegisterFlagCompletionFunc("lang", fixedValues("python", "bash", "js"))
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		x, err := c.CreateCodeContext(ctx, args[0], sdk.CreateCodeContextRequest{Language: *lang, Cwd: *cwd})
		if err != nil {
			return err
		}
		fmt.Println(x.ID)
		return nil
	})
	return cmd
}

func newCodeContextRestartCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restart SANDBOX CONTEXT",
		Short: "Give a code context a new kernel (its state is cleared)",
		Long: "Kills the context's kernel (with every process it started) and starts a new one under the\n" +
			"same ID: what brings back a context whose kernel died. Its variables and imports are lost.",
		Example:           "  clade code-context restart nb python",
		Args:              nargs(2, 2),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		return c.RestartCodeContext(ctx, args[0], args[1])
	})
	return cmd
}

func newCodeContextRemoveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "rm SANDBOX CONTEXT...",
		Aliases:           []string{"remove"},
		Short:             "Stop code contexts and their kernels",
		Example:           "  clade code-context rm nb 3f1c...",
		Args:              nargs(2, -1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		for _, id := range args[1:] {
			if err := c.RemoveCodeContext(ctx, args[0], id); err != nil {
				return err
			}
		}
		return nil
	})
	return cmd
}
