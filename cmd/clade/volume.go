package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/clade-sandbox/clade/sdk"
)

func newVolumeCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "volume VERB",
		Aliases: []string{"volumes"},
		Short:   "Make, list and remove named volumes",
		Example: "  clade volume create data --size 1GiB\n  clade create --volume data:/data\n  clade volume ls\n  clade volume rm data",
		Long:    "A volume outlives sandboxes: clade create --volume NAME:/path[:ro] mounts it.",
	})
	cmd.AddCommand(newVolumeCreateCmd(), newVolumeListCmd(), newVolumeInspectCmd(), newVolumeRemoveCmd(),
		newVolumeExportCmd(), newVolumeImportCmd())
	return cmd
}

func newVolumeCreateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create NAME [flags]",
		Short: "Make a named volume",
		Long: "Makes a named volume of a fixed size: writes past it fail with ENOSPC inside the sandbox.\n" +
			"With --encrypt the volume has a key of its own (sealed under the host key): its bytes on disk are\n" +
			"ciphertext, and `clade volume export` / `import` move it with its key to another host.\n" +
			"With --key-file too, the key is yours: hex of 32 bytes read from the file (the format export's\n" +
			"key file has), instead of a random one the daemon makes.",
		Example: "  clade volume create data --size 10GiB\n  clade volume create vault --encrypt\n" +
			"  head -c 32 /dev/urandom | xxd -p -c 64 > vault.key && chmod 600 vault.key\n" +
			"  clade volume create vault --encrypt --key-file vault.key\n  clade create --volume data:/data",
		Args: nargs(1, 1),
	}
	size := cmd.Flags().String("size", "", "the volume's `size`, e.g. 10GiB or 512MiB (default 1GiB)")
	encrypt := cmd.Flags().Bool("encrypt", false, "give the volume a key of its own (gocryptfs), so it can move to another host")
	keyFile := cmd.Flags().String("key-file", "", "with --encrypt: the volume's key, hex of 32 bytes, from this `file` (default: a random key)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		req := sdk.CreateVolumeRequest{Name: args[0], Encrypt: *encrypt}
		if *keyFile != "" {
			if !*encrypt {
				return usagef(cmd, "--key-file needs --encrypt")
			}
			key, err := readKeyFile(*keyFile)
			if err != nil {
				return err
			}
			req.Key = key
		}
		if *size != "" {
			mib, err := parseMiB(*size)
			if err != nil {
				return badArg("--size: %v", err)
			}
			req.SizeBytes = int64(mib) << 20
		}
		v, err := c.CreateVolume(ctx, req)
		if err != nil {
			return err
		}
		fmt.Println(v.Name)
		return nil
	})
	return cmd
}

func newVolumeListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List volumes and the sandboxes that mount them",
		Example: "  clade volume ls\n  clade volume ls --json",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		vs, err := c.ListVolumes(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(vs)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSIZE\tON DISK\tENCRYPTED\tUSED BY\tCREATED")
		for _, v := range vs {
			enc := "-"
			if v.Encrypted {
				enc = "yes"
			}
			fmt.Fprintf(tw, "%s\t%dMiB\t%dMiB\t%s\t%s\t%s ago\n", v.Name, v.SizeBytes>>20, v.UsedBytes>>20, enc, dash(strings.Join(v.UsedBy, ",")), time.Since(v.CreatedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}

func newVolumeInspectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "inspect NAME...",
		Short:             "Print volumes as JSON",
		Example:           "  clade volume inspect data\n  clade volume inspect data cache | jq '.[].used_by'",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeVolumes,
	}
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		var out []sdk.Volume
		for _, ref := range args {
			v, err := c.GetVolume(ctx, ref)
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		if len(out) == 1 {
			return printJSON(out[0])
		}
		return printJSON(out)
	})
	return cmd
}

func newVolumeRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "rm NAME...",
		Aliases:           []string{"remove"},
		Short:             "Remove volumes and their data",
		Example:           "  clade volume rm data\n  clade volume rm data cache",
		Long:              "Removes volumes and their data; a volume a sandbox mounts is refused.\nPrints each one removed; a failure does not stop the others.",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeVolumes,
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			return removeEach(args, false, func(ref string) error { return c.DeleteVolume(ctx, ref) })
		}),
	}
}

func newVolumeExportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export NAME FILE --key-file KEYFILE",
		Short: "Write an encrypted volume and its key to files, to move it to another host",
		Long: "Writes encrypted volume NAME (made with --encrypt) to FILE, a tar of its ciphertext only, and its key\n" +
			"to KEYFILE (created 0600; it must not exist). Keep the key apart from FILE: with it, FILE opens.\n" +
			"A volume in use is copied consistently (its file system is frozen for the copy).",
		Example:           "  clade volume export vault vault.tar --key-file vault.key\n  # on the other host:\n  clade volume import vault vault.tar --key-file vault.key",
		Args:              nargs(2, 2),
		ValidArgsFunction: completeVolumes,
	}
	keyFile := cmd.Flags().String("key-file", "", "write the volume's key to this `file` (required)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if *keyFile == "" {
			return fmt.Errorf("--key-file is required: the export is useless without its key")
		}
		key, err := c.VolumeKey(ctx, args[0])
		if err != nil {
			return err
		}
		// Both files are new (never overwritten); on any failure neither is left.
		kf, err := os.OpenFile(*keyFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = kf.WriteString(key + "\n")
		if cerr := kf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(*keyFile)
			return err
		}
		out, err := os.OpenFile(args[1], os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			os.Remove(*keyFile)
			return err
		}
		// Sparse: the unwritten blocks of the volume are zeros in the
		// archive, which take no disk here.
		sw := newSparseWriter(out)
		err = c.ExportVolume(ctx, args[0], sw)
		if cerr := sw.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(args[1])
			os.Remove(*keyFile)
		}
		return err
	})
	return cmd
}

func newVolumeImportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import NAME FILE --key-file KEYFILE",
		Short: "Make a volume of an export from another host",
		Long: "Makes encrypted volume NAME of FILE and KEYFILE, as `clade volume export` wrote them. The key is checked\n" +
			"to open the volume before anything is kept: a wrong key is an error, and nothing is imported.",
		Example: "  clade volume import vault vault.tar --key-file vault.key",
		Args:    nargs(2, 2),
	}
	keyFile := cmd.Flags().String("key-file", "", "the volume's key, as export wrote it (`file`, required)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if *keyFile == "" {
			return fmt.Errorf("--key-file is required")
		}
		key, err := readKeyFile(*keyFile)
		if err != nil {
			return err
		}
		f, err := os.Open(args[1])
		if err != nil {
			return err
		}
		defer f.Close()
		v, err := c.ImportVolume(ctx, args[0], f, key)
		if err != nil {
			return err
		}
		fmt.Println(v.Name)
		return nil
	})
	return cmd
}

// volumeFlags adds create's --volume and --volume-shared.
func volumeFlags(fs *pflag.FlagSet) func() ([]sdk.VolumeMount, error) {
	var own, shared multi
	fs.Var(&own, "volume", "mount volume NAME at /path, read-write or :ro: `NAME:/path[:ro]` (repeatable);\nfork children get their own copy as it was at the snapshot")
	fs.Var(&shared, "volume-shared", "like --volume, but fork children mount this same volume: `NAME:/path[:ro]` (repeatable)")
	return func() ([]sdk.VolumeMount, error) {
		var out []sdk.VolumeMount
		for _, set := range []struct {
			vals   multi
			shared bool
		}{{own, false}, {shared, true}} {
			for _, v := range set.vals {
				vm, err := parseVolumeMount(v)
				if err != nil {
					return nil, err
				}
				vm.Shared = set.shared
				out = append(out, vm)
			}
		}
		return out, nil
	}
}

// parseVolumeMount parses NAME:/path[:ro|:rw].
func parseVolumeMount(s string) (sdk.VolumeMount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return sdk.VolumeMount{}, fmt.Errorf("--volume %q: use NAME:/path or NAME:/path:ro", s)
	}
	vm := sdk.VolumeMount{Name: parts[0], Path: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			vm.ReadOnly = true
		case "rw":
		default:
			return sdk.VolumeMount{}, fmt.Errorf("--volume %q: the mode is ro or rw, not %q", s, parts[2])
		}
	}
	return vm, nil
}
