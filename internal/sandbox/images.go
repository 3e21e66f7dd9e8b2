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

// checkUnused refuses to remove an image in use.
func (m *Manager) checkUnused(ctx context.Context, name string) error {
	users, err := m.ImageUsers(ctx, name)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return errdefs.New(errdefs.Conflict, "image %s is in use by %s: remove them first", name, strings.Join(users, ", "))
	}
	return nil
}

// gcStaleRoot collects roots after a sandbox or snapshot went, but only when
// it stood on a root its image no longer names: removing sandboxes of a
// current image (the common case, on the rm hot path) needs no scan.
func (m *Manager) gcStaleRoot(ctx context.Context, imageName, rootfs string) {
	if rootfs == "" {
		return
	}
	if img, err := m.images.Get(ctx, imageName); err == nil && img.RootFS == rootfs {
		return
	}
	m.gcRoots(ctx)
}

// gcRoots removes image roots that no image names and no sandbox or
// snapshot stands on (the roots of replaced images, once unused).
func (m *Manager) gcRoots(ctx context.Context) {
	// Creates hold imageMu from reading an image's root to recording it.
	m.imageMu.Lock()
	defer m.imageMu.Unlock()
	inUse := map[string]bool{}
	if sbs, err := m.store.ListSandboxes(ctx); err == nil {
		for _, sb := range sbs {
			inUse[sb.RootFS] = true
		}
	} else {
		return
	}
	if snaps, err := m.store.ListSnapshots(ctx); err == nil {
		for _, sn := range snaps {
			inUse[sn.RootFS] = true
		}
	} else {
		return
	}
	if err := m.images.GCRoots(inUse); err != nil {
		m.log.Warn("image root collection", "err", err)
	}
}

// RemoveImage removes an image no sandbox or snapshot uses.
func (m *Manager) RemoveImage(ctx context.Context, name string) error {
	img, err := m.removeImage(ctx, name)
	if err != nil {
		return err
	}
	err = m.dropTemplateSnapshot(ctx, img.Snapshot)
	m.gcRoots(ctx)
	return err
}

// removeImage checks and removes under imageMu, so that no create starts
// on the image in between.
func (m *Manager) removeImage(ctx context.Context, name string) (image.Image, error) {
	m.imageMu.Lock()
	defer m.imageMu.Unlock()
	if err := m.checkUnused(ctx, name); err != nil {
		return image.Image{}, err
	}
	img, err := m.images.Get(ctx, name)
	if err != nil && !errdefs.IsInvalidArgument(err) {
		return image.Image{}, err
	}
	return img, m.images.Remove(ctx, name)
}

// dropTemplateSnapshot lets go of a template's former ready snapshot: it
// goes now if no sandbox was restored from it, else with the last of them
// (which keep working).
func (m *Manager) dropTemplateSnapshot(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if err := m.store.SetSnapshotImplicit(ctx, id); err != nil {
		return err
	}
	m.gcSnapshot(ctx, id)
	return nil
}

// PullImage pulls an image. Replacing an image of the same name is safe
// while sandboxes use it: they keep standing on the root they were made on.
func (m *Manager) PullImage(ctx context.Context, ref string, opts image.PullOptions) (image.Image, error) {
	defer m.gcRoots(ctx)
	return m.images.Pull(ctx, ref, opts)
}

// ImportImage imports an image archive, like PullImage.
func (m *Manager) ImportImage(ctx context.Context, path string, opts image.ImportOptions) (image.Image, error) {
	defer m.gcRoots(ctx)
	return m.images.Import(ctx, path, opts)
}
