package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/sdk"
)

func newImageCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "image VERB",
		Aliases: []string{"images"},
		Short:   "Pull, import, build, list and remove images",
		Example: "  clade image pull python:3.12-slim\n  clade image ls\n  clade image rm python:3.12-slim",
	})
	cmd.AddCommand(newImageListCmd(), newImagePullCmd(), newImageImportCmd(), newImageBuildCmd(), newImageInspectCmd(), newImageRemoveCmd())
	return cmd
}

func newImageListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List images",
		Example: "  clade image ls\n  clade image ls --json | jq -r '.[].name'",
		Args:    nargs(0, 0),
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		imgs, err := c.ListImages(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(imgs)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tREF\tSIZE\tCREATED\tSOURCE")
		for _, img := range imgs {
			ref := img.Ref
			if ref == "" {
				ref = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%dMiB\t%s\t%s\n", img.Name, ref, img.SizeBytes>>20, img.CreatedAt.Format(time.DateOnly), img.Source)
		}
		return tw.Flush()
	})
	return cmd
}

func newImageRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME|REF...",
		Aliases: []string{"remove"},
		Short:   "Remove images no sandbox or snapshot uses",
		Example: "  clade image rm python:3.12-slim\n  clade image rm app old-app",
		Long: "Removes images no sandbox or snapshot uses, by name or by the reference\n" +
			"they were pulled or imported as.",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeImages,
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			return removeEach(args, false, func(name string) error { return c.DeleteImage(ctx, name) })
		}),
	}
}

func newImagePullCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pull REF [flags]",
		Short: "Pull an image from a registry",
		Long: "Pulls an image from any OCI or Docker registry (credentials from\n" +
			"~/.docker/config.json). Layers are stored once and shared between images;\n" +
			"pulling an image already here is instant. Prints the image's name.",
		Example: "  clade image pull python:3.12-slim\n  clade image pull ghcr.io/org/tool:v2 --name tool",
		Args:    nargs(1, 1),
	}
	fs := cmd.Flags()
	var req sdk.PullImageRequest
	fs.StringVar(&req.Name, "name", "", "image name (default: derived from REF, e.g. python-3.12-slim)")
	fs.StringVar(&req.Platform, "platform", "", "platform of a multi-platform image (default linux/amd64)")
	fs.BoolVar(&req.Insecure, "insecure", false, "allow plain HTTP to the registry")
	quiet := fs.Bool("quiet", false, "no progress")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		req.Ref = args[0]
		p := newProgress(*quiet)
		img, err := c.PullImage(ctx, req, p.update)
		p.done()
		if err != nil {
			return err
		}
		fmt.Println(img.Name)
		return nil
	})
	return cmd
}

func newImageImportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "import FILE|DIR [flags]",
		Short:   "Import a docker save tarball or an OCI layout",
		Long:    "Imports a `docker save` tarball, or an OCI layout (a directory or its tar).\nPrints the image's name.",
		Example: "  docker save myapp:latest -o myapp.tar && clade image import myapp.tar",
		Args:    nargs(1, 1),
	}
	fs := cmd.Flags()
	name := fs.String("name", "", "image name (default: from the archive's tag or file name)")
	quiet := fs.Bool("quiet", false, "no progress")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		path := args[0]
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		var archive io.Reader = f
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			// An OCI layout directory: send it as the layout tar it would be.
			if _, err := os.Stat(filepath.Join(path, "oci-layout")); err != nil {
				return fmt.Errorf("%s is a directory without an oci-layout file: give a `docker save` tarball or an OCI layout", path)
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(tarx.Create(pw, path, ".")) }()
			defer pr.Close()
			archive = pr
		}
		p := newProgress(*quiet)
		img, err := c.ImportImage(ctx, archive, sdk.ImportImageRequest{Name: *name, Source: path}, p.update)
		p.done()
		if err != nil {
			return err
		}
		fmt.Println(img.Name)
		return nil
	})
	return cmd
}

func newImageInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "inspect NAME|REF",
		Short:   "Print an image as JSON",
		Example: "  clade image inspect default\n  clade image inspect python:3.12-slim | jq .config.env",
		Long: "Prints an image as JSON: source, layers, config and users. REF is a\n" +
			"reference the image was pulled or imported as, e.g. python:3.12-slim.",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeImages),
		RunE: withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
			img, err := c.GetImage(ctx, args[0])
			if err != nil {
				return err
			}
			return printJSON(img)
		}),
	}
}

// progress draws one updating line on a terminal and nothing elsewhere.
type progress struct {
	on   bool
	last time.Time
}

func newProgress(quiet bool) *progress {
	fi, err := os.Stderr.Stat()
	return &progress{on: !quiet && err == nil && fi.Mode()&os.ModeCharDevice != 0}
}

func (p *progress) update(u sdk.ImageProgress) {
	if !p.on || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	total := "?"
	if u.BytesTotal > 0 {
		total = fmt.Sprintf("%.1f", float64(u.BytesTotal)/(1<<20))
	}
	fmt.Fprintf(os.Stderr, "\r\033[Klayers %d/%d (%d cached)  %.1f/%s MiB", u.LayersDone, u.LayersTotal, u.Cached, float64(u.BytesDone)/(1<<20), total)
}

func (p *progress) done() {
	if p.on && !p.last.IsZero() {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
}

func newImageBuildCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "build NAME --from IMAGE [flags]",
		Short: "Build an image (or a template) from steps run in a sandbox",
		Long: "Builds an image: a sandbox of the --from image (a name, or a reference it\n" +
			"was pulled as) gets the copies and runs each --run step\n" +
			"(the first to fail stops the build), then its filesystem becomes image NAME.\n" +
			"With --start the image is a template: CMD runs in the background until\n" +
			"--ready exits 0 (or until something listens on TCP), and that running\n" +
			"sandbox is snapshotted; `clade create --image NAME` then restores it, with\n" +
			"CMD already running, instead of booting.",
		Example: "  clade image build py --from python:3.12-slim --run 'pip install numpy'\n" +
			"  clade image build web --from py --copy ./app:/app --start 'python3 -m http.server 8000'",
		Args: nargs(1, 1),
	}
	fs := cmd.Flags()
	var req sdk.BuildRequest
	var runs, copies, env multi
	fs.StringVar(&req.From, "from", "default", "base `image`: a name or a reference it was pulled or imported as")
	fs.Var(&runs, "run", "shell `command` to run (repeatable, in order)")
	fs.Var(&copies, "copy", "host file or directory SRC into the image at DST: `SRC:DST` (repeatable)")
	fs.Var(&env, "env", "`K=V` for the steps and the image (repeatable)")
	fs.StringVar(&req.Workdir, "workdir", "", "working `directory` of the steps and the image")
	fs.StringVar(&req.Start, "start", "", "make a template: the `command` its sandboxes start with")
	fs.StringVar(&req.Ready, "ready", "", "with --start: a `command` that exits 0 once the start command is ready")
	volumes := volumeFlags(fs)
	_ = cmd.RegisterFlagCompletionFunc("from", completeImages)
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		var err error
		req.Name, req.Run, req.Env, req.Output = args[0], runs, env, os.Stderr
		if req.Volumes, err = volumes(); err != nil {
			return err
		}
		for _, cp := range copies {
			src, dst, ok := strings.Cut(cp, ":")
			if !ok || src == "" || !strings.HasPrefix(dst, "/") {
				return fmt.Errorf("--copy %q: use SRC:DST with an absolute DST", cp)
			}
			if _, err := os.Lstat(src); err != nil {
				return fmt.Errorf("--copy: %w", err)
			}
			req.Copy = append(req.Copy, sdk.BuildCopy{Dest: dst, Tar: func() (io.ReadCloser, error) {
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(tarx.Create(pw, src, filepath.Base(filepath.Clean(src)))) }()
				return pr, nil
			}})
		}
		img, err := c.Build(ctx, req)
		if err != nil {
			return err
		}
		if img.Snapshot != "" {
			fmt.Fprintf(os.Stderr, "template %s: creates restore snapshot %s\n", img.Name, img.Snapshot)
		}
		fmt.Println(img.Name)
		return nil
	})
	return cmd
}
