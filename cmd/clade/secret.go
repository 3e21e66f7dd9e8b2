package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/clade-sandbox/clade/sdk"
)

func newSecretCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "secret VERB",
		Aliases: []string{"secrets"},
		Short:   "Store, list and remove sealed secrets",
		Example: "  clade secret set api-key < key.txt\n  clade create --secret api-key\n  clade secret ls\n  clade secret rm api-key",
		Long: "Secrets are sealed with the daemon's key. clade create --secret NAME[:ENVVAR] or\n" +
			"--secret-file NAME:/run/secrets/FILE hands one to a sandbox.",
	})
	cmd.AddCommand(newSecretSetCmd(), newSecretListCmd(), newSecretRemoveCmd())
	return cmd
}

func newSecretSetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set NAME [flags]",
		Short: "Store a secret read from stdin or a file",
		Long: "Stores a secret read from stdin (or --from-file), sealed with the daemon's key. Setting an existing\n" +
			"name makes a new version: sandboxes created from now on get it, running ones keep theirs.",
		Example:           "  printf %s \"$TOKEN\" | clade secret set api-key\n  clade secret set tls-key --from-file key.pem",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSecrets),
	}
	from := cmd.Flags().String("from-file", "", "read the value from this `file` instead of stdin")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		name := args[0]
		var r io.Reader = os.Stdin
		if *from != "" {
			f, err := os.Open(*from)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		} else if term.IsTerminal(int(os.Stdin.Fd())) {
			fmt.Fprintln(os.Stderr, "clade: reading the secret from stdin: type it, then Ctrl-D (or use --from-file)")
		}
		value, err := io.ReadAll(io.LimitReader(r, sdk.MaxSecretBytes+1))
		defer clear(value)
		if err != nil {
			return err
		}
		if len(value) > sdk.MaxSecretBytes {
			// Sent, a long one would fail as a request body over the
			// daemon's limit, which says nothing of secrets.
			return fmt.Errorf("secret %s: the value is over %d KiB, the most a secret holds", name, sdk.MaxSecretBytes>>10)
		}
		sc, err := c.SetSecret(ctx, name, value)
		if err != nil {
			return err
		}
		fmt.Printf("%s version %d\n", sc.Name, sc.Version)
		return nil
	})
	return cmd
}

func newSecretListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List secrets: names, versions and dates, never values",
		Example: "  clade secret ls\n  clade secret ls --json",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		scs, err := c.ListSecrets(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(scs)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tVERSION\tUSED BY\tUPDATED")
		for _, s := range scs {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s ago\n", s.Name, s.Version, len(s.UsedBy), time.Since(s.UpdatedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}

func newSecretRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "rm NAME...",
		Aliases:           []string{"remove"},
		Short:             "Remove secrets no sandbox uses",
		Example:           "  clade secret rm api-key\n  clade secret rm old-key other-key",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeSecrets,
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			return removeEach(args, false, func(name string) error { return c.DeleteSecret(ctx, name) })
		}),
	}
}

// secretFlags adds create's --secret and --secret-file.
func secretFlags(fs *pflag.FlagSet) func() ([]sdk.SecretRef, error) {
	var envs, files multi
	fs.Var(&envs, "secret", "put secret NAME into the environment: as $NAME upper-cased ('-' and '.' as '_'),\nor as $ENVVAR with `NAME[:ENVVAR]` (repeatable)")
	fs.Var(&files, "secret-file", "write secret NAME to /run/secrets/FILE, a tmpfs inside the sandbox:\n`NAME:/run/secrets/FILE` (repeatable)")
	return func() ([]sdk.SecretRef, error) {
		var out []sdk.SecretRef
		for _, v := range envs {
			name, env, _ := strings.Cut(v, ":")
			if name == "" {
				return nil, fmt.Errorf("--secret %q: use NAME or NAME:ENVVAR", v)
			}
			out = append(out, sdk.SecretRef{Name: name, Env: env})
		}
		for _, v := range files {
			name, file, ok := strings.Cut(v, ":")
			if !ok || name == "" || file == "" {
				return nil, fmt.Errorf("--secret-file %q: use NAME:/run/secrets/FILE", v)
			}
			out = append(out, sdk.SecretRef{Name: name, File: file})
		}
		return out, nil
	}
}
