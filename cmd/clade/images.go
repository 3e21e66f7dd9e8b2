package main

import (
	"context"
	"fmt"
	"os"
	"time"

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
	fs := newFlags("image import", "image import FILE [--name NAME] [--quiet]\n\nImports a `docker save` tarball or an OCI layout tar.")
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
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return fmt.Errorf("%s is a directory: tar an OCI layout first (tar -C %s -cf layout.tar .)", path, path)
	}
	p := newProgress(*quiet)
	img, err := c.ImportImage(ctx, f, *name, p.update)
	p.done()
	if err != nil {
		return err
	}
	fmt.Println(img.Name)
	return nil
}

func cmdImageInspect(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("image inspect", "image inspect NAME\n\nPrints an image as JSON: source, layers, config and users.")
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
