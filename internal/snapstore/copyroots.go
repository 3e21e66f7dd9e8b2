package snapstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// RootSource names the image root that the sealed image in dir (copied
// as name: "sleep/ID", "snapshot/ID") stands on, by identity (RootID), and
// writes that root's stream (image.SendRoot) when asked. An id of "" is a
// root no other node could use (the image's root is this node's only):
// nothing is copied.
type RootSource func(ctx context.Context, name, dir string) (id string, send func(ctx context.Context, w io.Writer) error, err error)

// RootSums keeps the SHA-256 of each root stream the store holds where
// the store's writers cannot change it (the cluster's directory): a root
// read back from the store is checked against it, never against a sum
// read from the same object. Its lock makes a root's upload and its sum's
// record one step (two nodes uploading one root at once would otherwise
// record their sums in the order they finish, which may not be the order
// their objects landed: a root's stream is not byte-identical on every
// node, as a pulled image's descriptor names each node's own pull, and
// sealed objects differ by their nonces), and so a delete of the root
// with the delete of its sum.
type RootSums interface {
	// RootSum returns the sum recorded for root id (nil if none).
	RootSum(ctx context.Context, id string) ([]byte, error)
	// LockRoot takes the lock on root id's object and sum, which one
	// holder at a time has cluster-wide (bound to its node's lease),
	// waiting while another holds it (calling waiting, if set, once
	// then).
	LockRoot(ctx context.Context, id string, waiting func()) (RootLock, error)
}

// RootLock is a lock on one root's object and sum (RootSums.LockRoot).
type RootLock interface {
	// RecordSum records the sum of the root's stream just uploaded,
	// replacing an earlier upload's, if the lock is still held
	// (ErrRootLockLost if not).
	RecordSum(ctx context.Context, sum []byte) error
	// DropSum deletes the root's recorded sum, if the lock is still held
	// (ErrRootLockLost if not).
	DropSum(ctx context.Context) error
	// Unlock lets the next holder in.
	Unlock()
}

// ErrRootLockLost is a RootLock's write refused because the lock went
// (the node's lease lapsed): another node may hold it now.
var ErrRootLockLost = errors.New("the lock on the image root went (this node's lease lapsed)")

// SetRootSums makes every root upload record its stream's SHA-256 in
// sums, and a root found in the store without a recorded sum (uploaded
// before sums were kept) uploaded again. Called once, before the first Put.
func (c *Copies) SetRootSums(sums RootSums) {
	if c != nil {
		c.mu.Lock()
		c.sums = sums
		c.mu.Unlock()
	}
}

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
	// Named again: no longer a candidate for deletion.
	_ = os.Remove(filepath.Join(c.dir, unneededDir, Digest(id).hex()))
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
	c.mu.Lock()
	sums := c.sums
	c.mu.Unlock()
	var lock RootLock
	if sums != nil {
		// Held across the look, the upload and the sum's record: another
		// node's upload of the root waits, then finds it there.
		lk, err := sums.LockRoot(ctx, id, func() { c.hook("root-lock-wait") })
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("snapshot store: copy of an image root failed (the image wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
			}
			return
		}
		defer lk.Unlock()
		lock = lk
	}
	has, err := rs.HasRoot(ctx, id)
	if err == nil && has && sums != nil {
		// A root stored without its sum recorded (an upload whose record
		// failed, or an older node's) is of no use to a wake, which never
		// trusts an unrecorded object: uploaded again, and its sum
		// recorded.
		if sum, serr := sums.RootSum(ctx, id); serr == nil && sum == nil {
			c.log.Info("snapshot store: the object store holds an image root with no digest recorded: uploading it again", "image", name, "root", id)
			has = false
		}
	}
	if err == nil && has {
		return
	}
	t0 := time.Now()
	var n countWriter
	h := sha256.New()
	err = rs.PutRoot(ctx, id, func(w io.Writer) error { return send(ctx, io.MultiWriter(w, &n, h)) })
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("snapshot store: copy of an image root failed (the image wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
		}
		return
	}
	c.hook("root-uploaded")
	if lock != nil {
		if err := lock.RecordSum(ctx, h.Sum(nil)); err != nil {
			if errors.Is(err, ErrRootLockLost) {
				// Another node may hold the lock and upload the root now:
				// not this node's to delete. If this upload landed last,
				// a wake finds it not the recorded one, and deletes it.
				c.log.Warn("snapshot store: record an image root's digest failed: the lock on it went (the image wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
				return
			}
			// A root whose sum is not recorded is refused by every wake:
			// deleted, so that the next copy on it tries again.
			c.log.Warn("snapshot store: record an image root's digest failed; the root is deleted from the store (the image wakes only where a live node holds its root)", "image", name, "root", id, "err", err)
			if err := rs.DeleteRoot(context.WithoutCancel(ctx), id); err != nil {
				c.log.Warn("snapshot store: delete an image root whose digest is not recorded", "root", id, "err", err)
			}
			return
		}
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

// unrefRoot drops image d's ref on its root before d is deleted. A root
// no image names any more is deleted RootGrace later (at once with no
// grace), if none names it then: a sandbox woken and slept again meanwhile
// (the common cycle of an idle sandbox on a root nothing else stands on)
// finds its root still there and uploads nothing. The candidate is a file
// of this node's records (unneeded-roots/HEX), so a restart sweeps it too.
func (c *Copies) unrefRoot(ctx context.Context, d Digest) {
	rs, ok := c.store.(RootStore)
	if !ok {
		return
	}
	id, unneeded, err := rs.UnrefRoot(ctx, d)
	if err != nil {
		c.log.Warn("snapshot store: drop an image's ref on its root (the root object may stay behind)", "digest", short(d), "root", id, "err", err)
		return
	}
	if !unneeded {
		return
	}
	if c.rootGrace.Load() <= 0 && c.deleteRoot(ctx, rs, id) {
		return
	}
	p := filepath.Join(c.dir, unneededDir, Digest(id).hex())
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
		err = os.WriteFile(p, []byte(id), 0o600)
	}
	if err != nil {
		c.log.Warn("snapshot store: note an unneeded image root (its object stays behind)", "root", id, "err", err)
	}
}

const unneededDir = "unneeded-roots"

// DefaultRootGrace is how long a root no stored image names stays in the
// store before it is deleted.
const DefaultRootGrace = time.Hour

// SetRootGrace sets how long a root no stored image names stays (0: it is
// deleted at once). Called before use.
func (c *Copies) SetRootGrace(d time.Duration) {
	if c != nil {
		c.rootGrace.Store(int64(d))
	}
}

// deleteRoot deletes root id unless an image names it, and reports
// whether it is done with it (deleted, or named again: its note goes).
// The refs are looked at twice: before the root is set aside and after.
// A copy that writes its ref between the first look and the set-aside
// may have found the root there and uploaded nothing: the second look
// sees its ref, and the root is put back. A copy whose ref comes after
// the second look finds no root (it is aside) and uploads it anew. A
// sweep killed midway leaves the root aside under this node's tag, with
// its note: the next sweep puts it back or deletes it.
func (c *Copies) deleteRoot(ctx context.Context, rs RootStore, id string) bool {
	tag, err := c.sweepTag()
	if err != nil {
		c.log.Warn("snapshot store: delete an unneeded image root (its object stays behind)", "root", id, "err", err)
		return false
	}
	named, err := rs.RootNamed(ctx, id)
	if err == nil && named {
		// Named again: kept (and put back if a killed sweep left it aside).
		err = rs.RestoreRoot(ctx, id, tag)
	}
	if err != nil || named {
		if err != nil {
			c.log.Warn("snapshot store: delete an unneeded image root (its object stays behind)", "root", id, "err", err)
		}
		return err == nil
	}
	c.hook("root-sweep-refs-listed")
	moved, err := rs.SetRootAside(ctx, id, tag)
	if err != nil {
		c.log.Warn("snapshot store: delete an unneeded image root (its object stays behind)", "root", id, "err", err)
		return false
	}
	c.hook("root-sweep-set-aside")
	named, err = rs.RootNamed(ctx, id)
	switch {
	case err != nil:
		c.log.Warn("snapshot store: delete an unneeded image root (set aside; the next sweep puts it back or deletes it)", "root", id, "err", err)
		return false
	case named:
		if err := rs.RestoreRoot(ctx, id, tag); err != nil {
			c.log.Warn("snapshot store: put back an image root named again while it was deleted (the next sweep tries again)", "root", id, "err", err)
			return false
		}
		c.log.Info("snapshot store: image root kept (an image named it again while it was deleted)", "root", id)
		return true
	}
	c.hook("root-sweep-refs-relisted")
	c.mu.Lock()
	sums := c.sums
	c.mu.Unlock()
	var lock RootLock
	if sums != nil {
		// The root's sum goes with it, under the lock: an upload of the
		// root meanwhile (a copy that named it after the second look,
		// found it aside, and uploads it) is then whole and recorded, and
		// its fresh sum stays.
		lk, err := sums.LockRoot(ctx, id, nil)
		if err != nil {
			c.log.Warn("snapshot store: delete an unneeded image root (set aside; the next sweep deletes it)", "root", id, "err", err)
			return false
		}
		defer lk.Unlock()
		lock = lk
	}
	if err := rs.DropRootAside(ctx, id, tag); err != nil {
		c.log.Warn("snapshot store: delete an unneeded image root (set aside; the next sweep deletes it)", "root", id, "err", err)
		return false
	}
	if lock != nil {
		has, err := rs.HasRoot(ctx, id)
		if err == nil && !has {
			err = lock.DropSum(ctx)
		}
		if err != nil {
			c.log.Warn("snapshot store: delete the recorded digest of a deleted image root (the next sweep tries again)", "root", id, "err", err)
			return false
		}
	}
	if moved {
		c.log.Info("snapshot store: image root deleted (no stored image names it)", "root", id)
	}
	c.hook("root-sweep-done")
	return true
}

// sweepTag is this node's name for the roots its sweeps set aside: random,
// made once and kept in its records (so a restarted node finds what it
// left aside).
func (c *Copies) sweepTag() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tag != "" {
		return c.tag, nil
	}
	p := filepath.Join(c.dir, "root-sweep.tag")
	if b, err := os.ReadFile(p); err == nil && validTag(string(b)) == nil {
		c.tag = string(b)
		return c.tag, nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tag := hex.EncodeToString(b[:])
	if err := writeFileAtomic(p, []byte(tag)); err != nil {
		return "", err
	}
	c.tag = tag
	return tag, nil
}

// SetTestHook sets a hook called at the steps of a root's upload and
// sweep (tests only: the race tests of this package and the cluster's).
// Set before the calls it sees.
func (c *Copies) SetTestHook(h func(step string)) {
	if h == nil {
		c.testHook.Store(nil)
		return
	}
	c.testHook.Store(&h)
}

// hook calls the test hook at step, if one is set.
func (c *Copies) hook(step string) {
	if h := c.testHook.Load(); h != nil {
		(*h)(step)
	}
}

// DropBadRoot deletes the stored root id that the caller read and
// refused (why): a damaged object would otherwise stay while any image
// names it, each copy finding it there and uploading nothing, each wake
// refusing it. The next copy of an image on the root uploads it anew.
// The caller holds the root's lock (RootSums.LockRoot) and has shown the
// object bad under it (the cluster's dropStoreRoot): a good upload cannot
// land between that and this delete.
func (c *Copies) DropBadRoot(ctx context.Context, id string, why error) {
	if c == nil {
		return
	}
	rs, ok := c.store.(RootStore)
	if !ok {
		return
	}
	if err := rs.DeleteRoot(ctx, id); err != nil {
		c.log.Warn("snapshot store: delete an image root that did not verify (it stays, and is refused again)", "root", id, "why", why, "err", err)
		return
	}
	c.log.Warn("snapshot store: image root deleted: it did not verify (the next sleep on it uploads it again)", "root", id, "why", why)
}

// sweepRoots deletes the noted unneeded roots older than the grace that
// still no image names (a root named again is kept, its note dropped).
func (c *Copies) sweepRoots(ctx context.Context, now time.Time) {
	rs, ok := c.store.(RootStore)
	if !ok {
		return
	}
	dir := filepath.Join(c.dir, unneededDir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		in, err := e.Info()
		if err != nil || now.Sub(in.ModTime()) < time.Duration(c.rootGrace.Load()) {
			continue
		}
		id := "sha256:" + e.Name()
		if validRoot(id) == nil && !c.deleteRoot(ctx, rs, id) {
			continue // kept for the next sweep
		}
		if err := ctx.Err(); err != nil {
			return // kept for the next sweep
		}
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
}

// sweepLoop sweeps the unneeded roots every minute until Close.
func (c *Copies) sweepLoop() {
	defer c.bg.Done()
	tk := time.NewTicker(time.Minute)
	defer tk.Stop()
	for {
		c.sweepRoots(c.ctx, time.Now())
		select {
		case <-c.ctx.Done():
			return
		case <-tk.C:
		}
	}
}
