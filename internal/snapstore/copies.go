package snapstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Copies is what the sandbox service uses: it copies the images it names
// ("sleep/ID", "snapshot/ID") into a Store after they are sealed, in the
// background, and fetches one back into its local dir when that is gone.
//
// A copy is claimed only by its record, DIR/KIND_ID.json holding the
// digest, written (renamed into place) after the Put returned: a daemon
// killed during a Put leaves no record, so nothing claims a copy that is
// not there (the objects of such a Put stay behind unclaimed until a
// later Put of the same image reuses them). A nil *Copies does nothing,
// so the service calls it unconditionally: the default single-node daemon
// has no snapshot store and keeps its images only where the engine wrote
// them.
type Copies struct {
	store Store
	dir   string
	log   *slog.Logger

	mu       sync.Mutex
	inflight map[string]*putJob
	// restoring serializes the fetches of Restore: two wakes or forks
	// that find an image gone fetch it once.
	restoring sync.Mutex
	bg        sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc

	// roots names and sends the image root a copy stands on (SetRoots);
	// rootBusy the roots being copied now, guarded by mu.
	roots     RootSource
	rootBusy  map[string]chan struct{}
	rootGrace atomic.Int64 // a time.Duration
	// tag names the roots this node's sweeps set aside (sweepTag);
	// guarded by mu.
	tag string
	// sums records each root's stream's SHA-256 (SetRootSums); guarded
	// by mu.
	sums RootSums
	// testHook, when set (tests), is called at the sweep's steps.
	testHook atomic.Pointer[func(step string)]
	// onCopied, when set (OnCopied), is called after each copy's record
	// is written.
	onCopied atomic.Pointer[func(name string)]
}

type putJob struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

type record struct {
	Digest Digest    `json:"digest"`
	Size   int64     `json:"size"`
	At     time.Time `json:"at"`
}

var nameRE = regexp.MustCompile(`^(sleep|snapshot)/[A-Za-z0-9_-]{1,128}$`)

// NewCopies keeps records of copies in s under dir.
func NewCopies(s Store, dir string, log *slog.Logger) (*Copies, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Copies{store: s, dir: dir, log: log, inflight: map[string]*putJob{}, ctx: ctx, cancel: cancel}
	c.rootGrace.Store(int64(DefaultRootGrace))
	if _, ok := s.(RootStore); ok {
		c.bg.Add(1)
		go c.sweepLoop()
	}
	return c, nil
}

// Store returns the store the copies go to (nil for a nil Copies).
func (c *Copies) Store() Store {
	if c == nil {
		return nil
	}
	return c.store
}

// KeyPlain is the KeyID of a store whose objects are not sealed.
const KeyPlain = "plain"

// KeyID says which key the store's objects are sealed under ("" for a nil
// Copies, KeyPlain for a store that seals nothing): see S3.KeyID.
func (c *Copies) KeyID() string {
	if c == nil {
		return ""
	}
	if k, ok := c.store.(interface{ KeyID() string }); ok {
		return k.KeyID()
	}
	return KeyPlain
}

func (c *Copies) recordPath(name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", errdefs.New(errdefs.InvalidArgument, "bad image name %q", name)
	}
	return filepath.Join(c.dir, name[:len(name)-len(filepath.Base(name))-1]+"_"+filepath.Base(name)+".json"), nil
}

// OnCopied sets f to be called, on the copy's goroutine, each time a copy
// is sealed (its record written: Digest names it from then on). The
// cluster writes a sleeping sandbox's record again at once then, so that
// other nodes may wake it without waiting for a periodic pass.
func (c *Copies) OnCopied(f func(name string)) {
	if c != nil {
		c.onCopied.Store(&f)
	}
}

// Put starts copying the sealed image in dir into the store as name,
// replacing an earlier copy being made of that name. It returns at once;
// Wait waits for it.
func (c *Copies) Put(name, dir string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if j := c.inflight[name]; j != nil {
		j.cancel()
	}
	ctx, cancel := context.WithCancel(c.ctx)
	j := &putJob{cancel: cancel, done: make(chan struct{})}
	c.inflight[name] = j
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer close(j.done)
		defer cancel()
		j.err = c.put(ctx, name, dir)
		if j.err != nil && ctx.Err() == nil {
			c.log.Warn("snapshot store: copy failed; the image is kept only locally", "image", name, "err", j.err)
		}
		c.mu.Lock()
		if c.inflight[name] == j {
			delete(c.inflight, name)
		}
		c.mu.Unlock()
	}()
}

func (c *Copies) put(ctx context.Context, name, dir string) error {
	p, err := c.recordPath(name)
	if err != nil {
		return err
	}
	t0 := time.Now()
	in, err := c.store.Put(ctx, dir)
	if err != nil {
		return err
	}
	// Its root before its record: a copy named anywhere has its root.
	c.copyRoot(ctx, name, dir, in.Digest)
	if err := ctx.Err(); err != nil {
		return err // dropped meanwhile: no record
	}
	b, _ := json.Marshal(record{Digest: in.Digest, Size: in.Size, At: time.Now().UTC()})
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	c.log.Info("snapshot store: image copied", "image", name, "digest", short(in.Digest), "size_mib", in.Size>>20, "took", time.Since(t0).Round(time.Millisecond))
	if f := c.onCopied.Load(); f != nil {
		(*f)(name)
	}
	return nil
}

// Wait waits for the copy of name being made, if any, and returns its
// error.
func (c *Copies) Wait(ctx context.Context, name string) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	j := c.inflight[name]
	c.mu.Unlock()
	if j == nil {
		return nil
	}
	select {
	case <-j.done:
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Digest returns the digest of name's recorded copy, errdefs.NotFound if
// there is none.
func (c *Copies) Digest(name string) (Digest, error) {
	if c == nil {
		return "", errdefs.New(errdefs.NotFound, "no snapshot store")
	}
	r, err := c.read(name)
	return r.Digest, err
}

func (c *Copies) read(name string) (record, error) {
	p, err := c.recordPath(name)
	if err != nil {
		return record{}, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, errdefs.New(errdefs.NotFound, "%s has no copy in the snapshot store", name)
	}
	if err != nil {
		return record{}, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("record of %s: %w", name, err)
	}
	if _, err := Parse(string(r.Digest)); err != nil {
		return record{}, fmt.Errorf("record of %s: %w", name, err)
	}
	return r, nil
}

// Restore fetches name's copy into dir when dir does not exist, and
// reports whether it did. dir present, or no copy recorded, is not an
// error (false): the caller verifies dir as ever. A copy that cannot be
// fetched or is corrupt is an error that says so; dir is then not made.
func (c *Copies) Restore(ctx context.Context, name, dir string) (bool, error) {
	if c == nil {
		return false, nil
	}
	present := func() bool {
		_, err := os.Lstat(dir)
		return err == nil || !errors.Is(err, fs.ErrNotExist)
	}
	// The common case, an image still here, never waits behind another
	// image's fetch; a missing one is checked again under the lock.
	if present() {
		return false, nil
	}
	c.restoring.Lock()
	defer c.restoring.Unlock()
	if present() {
		return false, nil
	}
	r, err := c.read(name)
	if errdefs.Is(err, errdefs.NotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	t0 := time.Now()
	if err := c.store.Fetch(ctx, r.Digest, dir); err != nil {
		return false, fmt.Errorf("%s is not on this host and its copy in the snapshot store cannot be used: %w", name, err)
	}
	c.log.Info("snapshot store: image fetched", "image", name, "digest", short(r.Digest), "size_mib", r.Size>>20, "took", time.Since(t0).Round(time.Millisecond))
	return true, nil
}

// Drop forgets name's copy: stops one being made, removes the record, and
// deletes the stored image in the background unless another record names
// it too. Dropping a name without a copy returns nil.
func (c *Copies) Drop(name string) error {
	if c == nil {
		return nil
	}
	c.stopPut(name)
	r, err := c.read(name)
	if errdefs.Is(err, errdefs.NotFound) {
		return nil
	}
	p, perr := c.recordPath(name)
	if perr != nil {
		return perr
	}
	if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return rerr
	}
	if err != nil {
		return nil // an unreadable record: nothing to delete by
	}
	if c.named(r.Digest) {
		return nil
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Minute)
		defer cancel()
		c.unrefRoot(ctx, r.Digest)
		if err := c.store.Delete(ctx, r.Digest); err != nil {
			c.log.Warn("snapshot store: delete failed; the object stays behind", "image", name, "digest", short(r.Digest), "err", err)
		}
	}()
	return nil
}

// named reports whether any record names d.
func (c *Copies) named(d Digest) bool {
	ents, _ := os.ReadDir(c.dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(c.dir, e.Name()))
		if err != nil {
			continue
		}
		var r record
		if json.Unmarshal(b, &r) == nil && r.Digest == d {
			return true
		}
	}
	return false
}

// Close stops the copies being made and waits for the background work.
func (c *Copies) Close() {
	if c == nil {
		return
	}
	c.cancel()
	c.bg.Wait()
}

// stopPut cancels a copy of name being made and waits until it ended.
func (c *Copies) stopPut(name string) {
	c.mu.Lock()
	j := c.inflight[name]
	c.mu.Unlock()
	if j != nil {
		j.cancel()
		<-j.done
	}
}
