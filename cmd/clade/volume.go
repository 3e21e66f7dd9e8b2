package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

func cmdVolume(ctx context.Context, c *sdk.Client, args []string) error {
	const synopsis = "volume create NAME [--size SIZE]   make a named volume (default 1GiB)\n       clade volume ls [--json]\n       clade volume inspect NAME...\n       clade volume rm NAME...\n\nA volume outlives sandboxes: clade create --volume NAME:/path[:ro] mounts it."
	if len(args) > 0 {
		switch args[0] {
		case "create":
			return cmdVolumeCreate(ctx, c, args[1:])
		case "ls", "list":
			return cmdVolumeList(ctx, c, args[1:])
		case "inspect":
			return cmdVolumeInspect(ctx, c, args[1:])
		case "rm", "remove":
			return cmdVolumeRemove(ctx, c, args[1:])
		}
	}
	fs := newFlags("volume", synopsis)
	fs.Usage()
	return errUsage
}

func cmdVolumeCreate(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("volume create", "volume create NAME [--size SIZE]\n\nMakes a named volume of a fixed size: writes past it fail with ENOSPC inside the sandbox.")
	size := fs.String("size", "", "the volume's size, e.g. 10GiB or 512MiB (default 1GiB)")
	name, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	req := sdk.CreateVolumeRequest{Name: name}
	if *size != "" {
		mib, err := parseMiB(*size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		req.SizeBytes = int64(mib) << 20
	}
	v, err := c.CreateVolume(ctx, req)
	if err != nil {
		return err
	}
	fmt.Println(v.Name)
	return nil
}

func cmdVolumeList(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("volume ls", "volume ls [--json]\n\nLists volumes and the sandboxes that mount them.")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	vs, err := c.ListVolumes(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(vs)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tON DISK\tUSED BY\tCREATED")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%dMiB\t%dMiB\t%s\t%s ago\n", v.Name, v.SizeBytes>>20, v.UsedBytes>>20, dash(strings.Join(v.UsedBy, ",")), time.Since(v.CreatedAt).Round(time.Second))
	}
	return tw.Flush()
}

func cmdVolumeInspect(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("volume inspect", "volume inspect NAME...\n\nPrints volumes as JSON.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	var out []sdk.Volume
	for _, ref := range fs.Args() {
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
}

func cmdVolumeRemove(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("volume rm", "volume rm NAME...\n\nRemoves volumes and their data; a volume a sandbox mounts is refused.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	for _, ref := range fs.Args() {
		if err := c.DeleteVolume(ctx, ref); err != nil {
			return err
		}
	}
	return nil
}

// volumeFlags adds create's --volume and --volume-shared.
func volumeFlags(fs *flag.FlagSet) func() ([]sdk.VolumeMount, error) {
	var own, shared multi
	fs.Var(&own, "volume", "mount volume NAME at /path, read-write or :ro (repeatable); fork children get their own copy as it was at the snapshot")
	fs.Var(&shared, "volume-shared", "like --volume, but fork children mount this same volume (repeatable)")
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
