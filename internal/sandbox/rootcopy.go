package sandbox

import (
	"context"
	"io"
	"strings"
)

// CopyRoot is the snapstore.RootSource of this node's copies (Copies.SetRoots):
// it names the image root a copied sleep image or snapshot stands on, and
// sends that root (an image's or a shipped one, pinned while it is sent),
// so that the object store holds the root beside the image and a sandbox
// wakes anywhere even once no live node holds its root. A root that is this
// node's only (its image was replaced since) is named "": not copied.
func (mv *Mover) CopyRoot(ctx context.Context, name, dir string) (string, func(ctx context.Context, w io.Writer) error, error) {
	m := mv.m
	var root string
	if id, ok := strings.CutPrefix(name, "sleep/"); ok {
		_, r, err := readSandboxFile(dir, id)
		if err != nil {
			return "", nil, err
		}
		root = r
	} else if id, ok := strings.CutPrefix(name, "snapshot/"); ok {
		sn, err := m.store.GetSnapshot(ctx, id)
		if err != nil {
			return "", nil, err
		}
		if root, err = m.images.rootIdentity(ctx, sn.Image, sn.RootFS); err != nil {
			return "", nil, err
		}
	}
	if root == "" {
		return "", nil, nil
	}
	send := func(ctx context.Context, w io.Writer) error {
		return m.images.SendRoot(ctx, root, func() io.Writer { return w })
	}
	return root, send, nil
}
