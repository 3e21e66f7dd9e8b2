package image

import (
	"context"
	"sort"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// catalog plays the daemon's part for these tests: it keeps the images by
// name (the daemon's store does), hands Pull the current image, and
// collects the roots and blobs of replaced and removed images.
type catalog struct {
	*Store
	t    testing.TB
	imgs map[string]Image
}

func newTestStore(t testing.TB) *catalog {
	t.Helper()
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &catalog{Store: s, t: t, imgs: map[string]Image{}}
}

func (c *catalog) put(img Image, err error) (Image, error) {
	if err != nil {
		return Image{}, err
	}
	if old, ok := c.imgs[img.Name]; ok && old.RootFS != img.RootFS {
		if err := c.RemoveRoot(old.RootFS); err != nil {
			c.t.Fatal(err)
		}
	}
	c.imgs[img.Name] = img
	c.gcBlobs()
	return img, nil
}

func (c *catalog) gcBlobs() {
	used := map[string]bool{}
	for _, img := range c.imgs {
		for _, l := range img.Layers {
			used[l] = true
		}
	}
	if err := c.GCBlobs(used); err != nil {
		c.t.Fatal(err)
	}
}

func (c *catalog) Pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
	name := opts.Name
	if name == "" {
		name = DefaultName(ref)
	}
	opts.Current = c.imgs[name]
	return c.put(c.Store.Pull(ctx, ref, opts))
}

func (c *catalog) Import(ctx context.Context, p string, opts ImportOptions) (Image, error) {
	return c.put(c.Store.Import(ctx, p, opts))
}

func (c *catalog) Get(ctx context.Context, name string) (Image, error) {
	img, ok := c.imgs[name]
	if !ok {
		return Image{}, errdefs.New(errdefs.NotFound, "no image %q", name)
	}
	return img, nil
}

func (c *catalog) List(ctx context.Context) ([]Image, error) {
	var out []Image
	for _, img := range c.imgs {
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (c *catalog) Remove(ctx context.Context, name string) error {
	img, ok := c.imgs[name]
	if !ok {
		return errdefs.New(errdefs.NotFound, "no image %q", name)
	}
	delete(c.imgs, name)
	c.gcBlobs()
	return c.RemoveRoot(img.RootFS)
}
