package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

func cmdSecret(ctx context.Context, c *sdk.Client, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "set":
			return cmdSecretSet(ctx, c, args[1:])
		case "ls", "list":
			return cmdSecretList(ctx, c, args[1:])
		case "rm", "remove":
			return cmdSecretRemove(ctx, c, args[1:])
		}
	}
	fs := newFlags("secret", "secret set NAME [--from-file F]   value from stdin or F; a new version for new sandboxes\n       clade secret ls [--json]\n       clade secret rm NAME...\n\nclade create --secret NAME[:ENVVAR] or --secret-file NAME:/run/secrets/FILE hands one to a sandbox.")
	fs.Usage()
	return errUsage
}

func cmdSecretSet(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("secret set", "secret set NAME [--from-file F]\n\nStores a secret read from stdin (or F), sealed with the daemon's key. Setting an existing\nname makes a new version: sandboxes created from now on get it, running ones keep theirs.")
	from := fs.String("from-file", "", "read the value from this file instead of stdin")
	name, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	var r io.Reader = os.Stdin
	if *from != "" {
		f, err := os.Open(*from)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	value, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return err
	}
	defer clear(value)
	sc, err := c.SetSecret(ctx, name, value)
	if err != nil {
		return err
	}
	fmt.Printf("%s version %d\n", sc.Name, sc.Version)
	return nil
}

func cmdSecretList(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("secret ls", "secret ls [--json]\n\nLists secrets: names, versions and dates, never values.")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
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
}

func cmdSecretRemove(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("secret rm", "secret rm NAME...\n\nRemoves secrets no sandbox uses.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	for _, name := range fs.Args() {
		if err := c.DeleteSecret(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// secretFlags adds create's --secret and --secret-file.
func secretFlags(fs *flag.FlagSet) func() ([]sdk.SecretRef, error) {
	var envs, files multi
	fs.Var(&envs, "secret", "put secret NAME into the environment: as $NAME upper-cased ('-' and '.' as '_'), or as $ENVVAR with NAME:ENVVAR (repeatable)")
	fs.Var(&files, "secret-file", "write secret NAME to /run/secrets/FILE, a tmpfs inside the sandbox: NAME:/run/secrets/FILE (repeatable)")
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
