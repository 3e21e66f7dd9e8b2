package snapstore

import (
	"context"
	"io"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// RootSource names the image root that the sealed image in dir (copied
// as name: "sleep/ID", "snapshot/ID") stands on, by identity (RootID), and
// writes that root's stream (image.SendRoot) when asked. An id of "" is a
// root no other node could use (the image's root is this node's only):
// nothing is copied.
type RootSource func(ctx context.Context, name, dir string) (id string, send func(ctx context.Context, w io.Writer) error, err error)

// SetRoots makes every copy also copy the image root it stands on, once
// per root, into a store that keeps roots (RootStore), before the copy's
// record is written: a copy that Digest names has its root in the store
// too (unless that copy failed: then it is logged and the record written
// all the same, and the image wakes only where a live node holds the
// root, as before). Called once, before the first Put.
func (c *Copies) SetRoots(src RootSource) {
	if c == nil {
		return
	}
	c.roots = src
}

// copyRoot copies the root of the image d (in dir, copied as name) into
// the store unless it is there, after recording that d stands on it.
// Concurrent copies of images on one root upload it once.
func (c *Copies) copyRoot(ctx context.Context, name, dir string, d Digest) {
	rs, ok := c.store.(RootStore)
	if !ok || c.roots == nil {
		return
	}
	id, send, err := c.roots(ctx, name, dir)
	if err != nil || id == "" {
		if err != nil && ctx.Err() == nil {
			c.log.Warn("snapshot store: the image's root is not copied (it wakes only where a live node holds its root)", "image", name, "err", err)
		}
		return
	}
	// The ref first: a collection racing this copy sees the root named.
	if err := rs.RefRoot(ctx, id, d); err != nil {
		c.log.Warn("snapshot store: the image's root is not copied (it wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
		return
	}
	for {
		c.mu.Lock()
		ch, busy := c.rootBusy[id]
		if !busy {
			if c.rootBusy == nil {
				c.rootBusy = map[string]chan struct{}{}
			}
			ch = make(chan struct{})
			c.rootBusy[id] = ch
			c.mu.Unlock()
			defer func() {
				c.mu.Lock()
				delete(c.rootBusy, id)
				c.mu.Unlock()
				close(ch)
			}()
			break
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
	has, err := rs.HasRoot(ctx, id)
	if err == nil && has {
		return
	}
	t0 := time.Now()
	var n countWriter
	err = rs.PutRoot(ctx, id, func(w io.Writer) error { return send(ctx, io.MultiWriter(w, &n)) })
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("snapshot store: copy of an image root failed (the image wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
		}
		return
	}
	c.log.Info("snapshot store: image root copied", "image", name, "root", id, "size_mib", int64(n)>>20, "took", time.Since(t0).Round(time.Millisecond))
}

type countWriter int64

func (n *countWriter) Write(p []byte) (int, error) {
	*n += countWriter(len(p))
	return len(p), nil
}

// OpenRoot opens the root stream of the image root with identity id from
// the store: NotFound when the store does not hold it (or keeps no roots).
// What it reads is unverified: the caller checks it (image.ReceiveRoot).
func (c *Copies) OpenRoot(ctx context.Context, id string) (io.ReadCloser, error) {
	if c == nil {
		return nil, errdefs.New(errdefs.NotFound, "this node has no object store to fetch image root %.19s from", id)
	}
	rs, ok := c.store.(RootStore)
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "this node's object store keeps no image roots")
	}
	t0 := time.Now()
	rc, err := rs.OpenRoot(ctx, id)
	if err == nil {
		c.log.Info("snapshot store: image root opened", "root", id, "took", time.Since(t0).Round(time.Millisecond))
	}
	return rc, err
}

// unrefRoot drops image d's ref on its root, deleting the root once no
// image names it: before d itself is deleted.
func (c *Copies) unrefRoot(ctx context.Context, d Digest) {
	rs, ok := c.store.(RootStore)
	if !ok {
		return
	}
	if id, err := rs.UnrefRoot(ctx, d); err != nil {
		c.log.Warn("snapshot store: drop an image's ref on its root (the root object may stay behind)", "digest", short(d), "root", id, "err", err)
	}
}
