package sandbox

import (
	"context"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
)

// ImageUsers lists the sandboxes and snapshots made from an image: its
// rootfs is their lower layer, so it must outlive them.
func (m *Manager) ImageUsers(ctx context.Context, name string) ([]string, error) {
	var users []string
	sbs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		if sb.Image == name {
			users = append(users, "sandbox "+sb.ID)
		}
	}
	snaps, err := m.store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	own := ""
	if img, err := m.images.Get(ctx, name); err == nil {
		own = img.Snapshot // a template's own ready snapshot goes with it
	}
	for _, sn := range snaps {
		if sn.Image == name && sn.ID != own {
			users = append(users, "snapshot "+sn.ID)
		}
	}
	return users, nil
}

// CheckImageReplaceable refuses to remove or replace an image in use.
func (m *Manager) CheckImageReplaceable(ctx context.Context, name, what string) error {
	if name == "" {
		return nil
	}
	users, err := m.ImageUsers(ctx, name)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return errdefs.New(errdefs.Conflict, "image %s is in use by %s: remove them first, or %s under another name", name, strings.Join(users, ", "), what)
	}
	return nil
}

// RemoveImage removes an image no sandbox or snapshot uses.
func (m *Manager) RemoveImage(ctx context.Context, name string) error {
	m.imageMu.Lock()
	defer m.imageMu.Unlock()
	if err := m.CheckImageReplaceable(ctx, name, "keep it"); err != nil {
		return err
	}
	img, err := m.images.Get(ctx, name)
	if err != nil && !errdefs.IsInvalidArgument(err) {
		return err
	}
	if err := m.images.Remove(ctx, name); err != nil {
		return err
	}
	return m.dropTemplateSnapshot(ctx, img.Snapshot)
}

// dropTemplateSnapshot removes a template's former ready snapshot. No
// sandbox uses it (the image could not have been removed or replaced
// otherwise).
func (m *Manager) dropTemplateSnapshot(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	sn, err := m.store.GetSnapshot(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return m.removeSnapshot(ctx, sn)
}

// PullImage pulls an image. The store asks CanReplace before it replaces an
// image of the same name, so one in use is never swapped out from under its
// sandboxes; pulling what is already there changes nothing and is allowed.
func (m *Manager) PullImage(ctx context.Context, ref string, opts image.PullOptions) (image.Image, error) {
	return m.images.Pull(ctx, ref, opts)
}

// ImportImage imports an image archive, under the same rule as PullImage.
func (m *Manager) ImportImage(ctx context.Context, path string, opts image.ImportOptions) (image.Image, error) {
	return m.images.Import(ctx, path, opts)
}
