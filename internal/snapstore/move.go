package snapstore

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Fetch writes the stored image with digest into dir, verified, without a
// record: a node that takes over a sleeping sandbox it never held fetches
// its image by the digest the cluster's directory names (the holder's
// record is on the holder). A nil Copies answers that the node has no
// snapshot store.
func (c *Copies) Fetch(ctx context.Context, d Digest, dir string) error {
	if c == nil {
		return errNoStore
	}
	t0 := time.Now()
	if err := c.store.Fetch(ctx, d, dir); err != nil {
		return err
	}
	c.log.Info("snapshot store: image fetched by digest", "digest", short(d), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

var errNoStore = errdefs.New(errdefs.Conflict, "this node has no snapshot store (daemon flag --object-store)")

// Claim records that name's copy is the stored image d (a copy another
// node made, fetched by Fetch): from now on Drop deletes it like a copy
// of this node's own, once nothing needs it.
func (c *Copies) Claim(name string, d Digest) error {
	if c == nil {
		return errNoStore
	}
	p, err := c.recordPath(name)
	if err != nil {
		return err
	}
	if _, err := Parse(string(d)); err != nil {
		return err
	}
	in, err := c.store.Stat(c.ctx, d)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(record{Digest: d, Size: in.Size, At: time.Now().UTC()})
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// Forget forgets name's copy without deleting the stored image: stops a
// copy being made and removes the record. A node whose sandbox the
// cluster moved to another node forgets its copy, which the other node
// now relies on (Drop would delete it).
func (c *Copies) Forget(name string) error {
	if c == nil {
		return nil
	}
	c.stopPut(name)
	p, err := c.recordPath(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
