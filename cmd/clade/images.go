package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/sdk"
)

func cmdImagePull(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("image pull", "image pull REF [--name NAME] [--platform OS/ARCH] [--quiet] [--insecure]\n\nPulls an image from any OCI or Docker registry (credentials from\n~/.docker/config.json). Layers are stored once and shared between images;\npulling an image already here is instant.")
	var req sdk.PullImageRequest
	fs.StringVar(&req.Name, "name", "", "image name (default: derived from REF, e.g. python-3.12-slim)")
	fs.StringVar(&req.Platform, "platform", "", "platform of a multi-platform image (default linux/amd64)")
	fs.BoolVar(&req.Insecure, "insecure", false, "allow plain HTTP to the registry")
	quiet := fs.Bool("quiet", false, "no progress")
	ref, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	req.Ref = ref
	p := newProgress(*quiet)
	img, err := c.PullImage(ctx, req, p.update)
	p.done()
	if err != nil {
		return err
	}
	fmt.Println(img.Name)
	return nil
}

func cmdImageImport(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("image import", "image import FILE|DIR [--name NAME] [--quiet]\n\nImports a `docker save` tarball, or an OCI layout (a directory or its tar).")
	name := fs.String("name", "", "image name (default: from the archive's tag or file name)")
	quiet := fs.Bool("quiet", false, "no progress")
	path, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
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
}

func cmdImageInspect(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("image inspect", "image inspect NAME|REF\n\nPrints an image as JSON: source, layers, config and users. REF is a\nreference the image was pulled or imported as, e.g. python:3.12-slim.")
	name, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	img, err := c.GetImage(ctx, name)
	if err != nil {
		return err
	}
	return printJSON(img)
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

func cmdImageBuild(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("image build", "image build NAME --from NAME|REF [--run CMD]... [--copy SRC:DST]... [--env K=V]... [--workdir DIR]\n                  [--start CMD [--ready CMD] [--volume NAME:/path]...]\n\nBuilds an image: a sandbox of the --from image (a name, or a reference it\nwas pulled as) gets the copies and runs each --run step\n(the first to fail stops the build), then its filesystem becomes image NAME.\nWith --start the image is a template: CMD runs in the background until\n--ready exits 0 (or until something listens on TCP), and that running\nsandbox is snapshotted; `clade create --image NAME` then restores it, with\nCMD already running, instead of booting.")
	var req sdk.BuildRequest
	var runs, copies, env multi
	fs.StringVar(&req.From, "from", "default", "base image: a name or a reference it was pulled or imported as")
	fs.Var(&runs, "run", "shell command to run (repeatable, in order)")
	fs.Var(&copies, "copy", "SRC:DST: host file or directory SRC into the image at DST (repeatable)")
	fs.Var(&env, "env", "K=V for the steps and the image (repeatable)")
	fs.StringVar(&req.Workdir, "workdir", "", "working directory of the steps and the image")
	fs.StringVar(&req.Start, "start", "", "make a template: the command its sandboxes start with")
	fs.StringVar(&req.Ready, "ready", "", "with --start: a command that exits 0 once the start command is ready")
	volumes := volumeFlags(fs)
	name, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	req.Name, req.Run, req.Env, req.Output = name, runs, env, os.Stderr
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
}
