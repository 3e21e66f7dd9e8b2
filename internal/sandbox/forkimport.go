package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/clade-sandbox/clade/internal/store"
)

// Porter is the lifecycle's side of a fork across nodes (internal/cluster
// drives it): the owner exports a sealed snapshot (api.SnapshotExport, then Open to
// stream its image to a peer), a target imports it (Import: fetched by
// digest, verified, recorded as an implicit snapshot of its own, forked
// with the local fork). It is a part of its own so that the Manager keeps
// its method budget.
type Porter struct{ m *Manager }

// NewPorter returns m's Porter.
func NewPorter(m *Manager) *Porter { return &Porter{m: m} }

// RootID is the identity of img's root filesystem, the same on every node
// that holds the same root: for an image pulled or imported from OCI or a
// `docker save` archive, its content's digests (manifest if any, config,
// layers, platform), so that nodes that pulled or imported it apart agree;
// for one built here (debootstrap, a commit), its whole descriptor (name,
// source, root id, creation time, config), which only nodes sharing its
// image directory share, and nodes it was shipped to (roots.go).
func RootID(img image.Image) string {
	var b []byte
	if img.ManifestDigest != "" || img.ConfigDigest != "" {
		b, _ = json.Marshal([]any{"oci", img.ManifestDigest, img.ConfigDigest, img.Layers, img.Platform})
	} else {
		img.Snapshot, img.RootFS = "", ""
		b, _ = json.Marshal(img)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// pins keep the snapshots a fork across nodes is sending or restoring from
// collection (gcSnapshot) while no child records them yet; Open serves
// only pinned images.
type pins struct {
	mu       sync.Mutex
	n        map[string]int    // by snapshot id; guarded by mu
	byDigest map[string]string // digest -> snapshot id; guarded by mu
}

func (p *pins) pin(id, digest string) (unpin func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n, p.byDigest = map[string]int{}, map[string]string{}
	}
	p.n[id]++
	if digest != "" {
		p.byDigest[digest] = id
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.n[id]--; p.n[id] <= 0 {
				delete(p.n, id)
				for d, x := range p.byDigest {
					if x == id {
						delete(p.byDigest, d)
					}
				}
			}
		})
	}
}

func (p *pins) held(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id] > 0
}

func (p *pins) lookup(digest string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.byDigest[digest]
	return id, ok
}

// Export readies source for n children on other nodes (n within the
// node's --max-fork): a ready snapshot, or
// a running sandbox snapshotted now (implicitly: the snapshot goes with its
// last child here, and at release when it has none). The snapshot is
// pinned, and its image served by Open, until release.
func (p *Porter) Export(ctx context.Context, source string, n int) (api.SnapshotExport, func(), error) {
	m := p.m
	if n < 1 || n > m.cfg.MaxFork {
		return api.SnapshotExport{}, nil, errdefs.New(errdefs.InvalidArgument, "n=%d: give 1 to %d children per fork (daemon flag --max-fork)", n, m.cfg.MaxFork)
	}
	if _, err := snapshotterOf(m.eng); err != nil {
		return api.SnapshotExport{}, nil, err
	}
	sn, err := m.store.GetSnapshot(ctx, source)
	if errdefs.IsNotFound(err) {
		if _, perr := m.store.GetSandbox(ctx, source); errdefs.IsNotFound(perr) {
			return api.SnapshotExport{}, nil, errdefs.New(errdefs.NotFound, "no snapshot or sandbox called %s (see `clade snapshot ls` and `clade ls`)", source)
		} else if perr != nil {
			return api.SnapshotExport{}, nil, perr
		}
		if sn, err = m.Snapshot(ctx, source, "", true); err != nil {
			return api.SnapshotExport{}, nil, err
		}
	} else if err != nil {
		return api.SnapshotExport{}, nil, err
	} else if sn.State != store.SnapshotReady {
		return api.SnapshotExport{}, nil, errdefs.New(errdefs.Conflict, "snapshot %s is still being taken", source)
	}
	unpin := m.pins.pin(sn.ID, "")
	release := func() {
		unpin()
		m.gcSnapshot(context.WithoutCancel(ctx), sn.ID)
	}
	e, err := p.describe(ctx, sn)
	if err != nil {
		release()
		return api.SnapshotExport{}, nil, err
	}
	unpinDigest := m.pins.pin(sn.ID, e.Digest)
	return e, func() { unpinDigest(); release() }, nil
}

// describe is sn's export, its image restored from the snapshot store if
// the local copy is gone and verified.
func (p *Porter) describe(ctx context.Context, sn store.Snapshot) (api.SnapshotExport, error) {
	m := p.m
	if _, err := m.cfg.Copies.Restore(ctx, snapshotCopy(sn.ID), sn.Path); err != nil {
		return api.SnapshotExport{}, err
	}
	if !stateimg.Sealed(sn.Path) {
		return api.SnapshotExport{}, errdefs.New(errdefs.Conflict, "snapshot %s has no sealed image (taken by an older clade): its children stay on its node", sn.ID)
	}
	if err := stateimg.VerifyAs(sn.Path, "snapshot "+sn.ID); err != nil {
		return api.SnapshotExport{}, err
	}
	d, _, err := snapstore.DigestOf(sn.Path)
	if err != nil {
		return api.SnapshotExport{}, err
	}
	e := api.SnapshotExport{ID: sn.ID, Name: sn.Name, Sandbox: sn.Sandbox, Image: sn.Image, MemoryMiB: sn.MemoryMiB, CPUs: sn.CPUs,
		Env: sn.Env, Engine: sn.Opts.Engine, Digest: string(d), SizeBytes: sn.SizeBytes}
	if e.Opts, err = json.Marshal(sn.Opts); err != nil {
		return api.SnapshotExport{}, err
	}
	switch {
	case len(sn.Opts.Volumes) > 0:
		e.Local = "its sandbox mounts volumes, which are this node's own"
	case len(sn.Opts.Secrets) > 0:
		e.Local = "its sandbox takes secrets, which are this node's own"
	}
	// The root the snapshot stands on: its image's, or one shipped here.
	if e.ImageID, err = m.images.rootIdentity(ctx, sn.Image, sn.RootFS); err != nil {
		e.Local = fmt.Sprintf("its image %s: %v", sn.Image, err)
	}
	return e, nil
}

// Open returns the directory of the image with digest, while an Export
// holds it, for a peer to fetch; release when the copy is done. An image
// no export holds is NotFound: a peer fetches only what is being sent.
func (p *Porter) Open(digest string) (string, func(), error) {
	m := p.m
	id, ok := m.pins.lookup(digest)
	if !ok {
		return "", nil, errdefs.New(errdefs.NotFound, "no snapshot image %.80s is being sent from this node", digest)
	}
	m.crash.hit("xfork-export-open") // a peer is about to fetch the image
	unpin := m.pins.pin(id, "")
	sn, err := m.store.GetSnapshot(context.Background(), id)
	if err != nil {
		unpin()
		return "", nil, err
	}
	return sn.Path, unpin, nil
}

// Import restores n children of e on this node: its image is fetched (by
// fetch, into a directory that must not exist yet) and verified against
// e's digest unless this node holds it already, recorded as an implicit
// snapshot (it goes with its last child here), and forked with the local
// fork. A node without room refuses before fetching; one without e's image
// root (it lacks the image, or has another root of it) fetches that root
// first with fetchRoot (image.SendRoot's stream, verified: Images.rootFor). A daemon killed midway leaves a fetch directory or an unused
// implicit snapshot, which the restart census removes.
func (p *Porter) Import(ctx context.Context, e api.SnapshotExport, n int, fetch func(ctx context.Context, dir string) error, fetchRoot RootFetch) (ForkResult, error) {
	return p.ImportAs(ctx, e, n, fetch, fetchRoot, nil)
}

// ImportAs is Import that picks the children's ids before anything is
// fetched and hands them to reserve (when not nil): a cluster writes
// their records (importing) there, so that its listings show them while
// the image and its root are fetched. A reserve that fails ends the
// import before the fetch. The ids are the ones the children get (a
// child that fails has none in the answer).
func (p *Porter) ImportAs(ctx context.Context, e api.SnapshotExport, n int, fetch func(ctx context.Context, dir string) error, fetchRoot RootFetch,
	reserve func(ids []string) error) (ForkResult, error) {
	m := p.m
	if n < 1 || n > m.cfg.MaxFork {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "n=%d: give 1 to %d children (daemon flag --max-fork)", n, m.cfg.MaxFork)
	}
	if err := validID(e.ID); err != nil {
		return ForkResult{}, err
	}
	d, err := snapstore.Parse(e.Digest)
	if err != nil {
		return ForkResult{}, err
	}
	var opts store.Options
	if err := json.Unmarshal(e.Opts, &opts); err != nil {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "snapshot %s: its options do not parse: %v", e.ID, err)
	}
	if len(opts.Volumes) > 0 || len(opts.Secrets) > 0 || e.Local != "" {
		// Volumes and secrets are each node's own: a peer's snapshot that
		// names some would mount this node's under that name.
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "snapshot %s mounts volumes or takes secrets (each node's own): its children stay on its node", e.ID)
	}
	if e.MemoryMiB < 1 || e.MemoryMiB > m.cfg.MaxMemoryMiB || e.CPUs <= 0 || e.CPUs > m.cfg.MaxCPUs {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "snapshot %s: %d MiB and %g CPUs are outside what this node allows (%d MiB, %g CPUs)", e.ID, e.MemoryMiB, e.CPUs, m.cfg.MaxMemoryMiB, m.cfg.MaxCPUs)
	}
	if _, err := snapshotterOf(m.eng); err != nil {
		return ForkResult{}, err
	}
	if !validRootID(e.ImageID) {
		return ForkResult{}, errdefs.New(errdefs.InvalidArgument, "snapshot %s names no image root (%.80q)", e.ID, e.ImageID)
	}
	if err := m.admission.checkDisk("fork"); err != nil {
		return ForkResult{}, err
	}
	// Refused before a byte is fetched when the children cannot fit (at
	// their cheapest: sharing the snapshot's memory); the fork admits
	// them again at their real count.
	resv, err := m.admission.admitFork(n, e.MemoryMiB, true)
	if err != nil {
		return ForkResult{}, err
	}
	recs := p.childRecords(ctx, e, opts, n)
	forked := false
	defer func() {
		if !forked {
			// Prepared sandboxes of the warm pool taken for the children.
			for _, r := range recs {
				_ = m.pools.destroyPrepared(context.WithoutCancel(ctx), r.ID)
			}
		}
	}()
	if reserve != nil {
		ids := make([]string, n)
		for i, r := range recs {
			ids[i] = r.ID
		}
		if err := reserve(ids); err != nil {
			resv.release()
			return ForkResult{}, err
		}
	}
	// The very root the snapshot stands on: this node's image if it is
	// that root, else the root fetched (by fetchRoot) from a node that
	// holds it.
	img, unpinRoot, err := m.images.rootFor(ctx, e.Image, e.ImageID, fetchRoot)
	if err != nil {
		resv.release()
		return ForkResult{}, errdefs.Wrap(errdefs.ClassOf(err), fmt.Errorf("this node cannot restore snapshot %s: %w", e.ID, err))
	}
	defer unpinRoot()
	unpin := m.pins.pin(e.ID, "")
	defer func() {
		unpin()
		m.gcSnapshot(context.WithoutCancel(ctx), e.ID)
	}()
	sn := store.Snapshot{ID: e.ID, Name: "", Image: e.Image, State: store.SnapshotReady, MemoryMiB: e.MemoryMiB, CPUs: e.CPUs,
		Env: e.Env, Path: filepath.Join(m.cfg.SnapshotDir, e.ID), Implicit: true, RootFS: img.RootFS, Opts: opts, CreatedAt: time.Now()}
	if err := p.fetchOnce(ctx, sn, d, fetch); err != nil {
		resv.release()
		return ForkResult{}, err
	}
	resv.release()
	forked = true
	return m.fork(ctx, e.ID, recs)
}

// childRecords are the n children of an import with their ids, picked
// before the fetch: prepared sandboxes of the warm pool when this node's
// image is the snapshot's root (as the fork would take them), else new.
func (p *Porter) childRecords(ctx context.Context, e api.SnapshotExport, opts store.Options, n int) []store.Sandbox {
	m := p.m
	img, err := m.images.Get(ctx, e.Image)
	current := err == nil && RootID(img) == e.ImageID
	sh := shapeOf(e.Image, e.MemoryMiB, e.CPUs, e.Env, opts)
	recs := make([]store.Sandbox, n)
	for i := range recs {
		id, ok := takeIf(current, m.pools.warm.Take, sh)
		if !ok {
			id = newID()
		}
		recs[i].ID = id
	}
	return recs
}

// fetchOnce makes sn (at sn.Path, the image d) a ready snapshot of this
// node, unless it is one already. Under the snapshot's lock: two imports
// of one snapshot fetch it once.
func (p *Porter) fetchOnce(ctx context.Context, sn store.Snapshot, d snapstore.Digest, fetch func(ctx context.Context, dir string) error) error {
	m := p.m
	unlock := m.locks.lock(sn.ID)
	defer unlock()
	if have, err := m.store.GetSnapshot(ctx, sn.ID); err == nil {
		got, _, derr := snapstore.DigestOf(have.Path)
		if have.State == store.SnapshotReady && derr == nil && got == d && stateimg.VerifyAs(have.Path, "snapshot "+sn.ID) == nil {
			return nil
		}
		return errdefs.New(errdefs.Conflict, "snapshot %s is on this node already with another image (%v): not fetched over it", sn.ID, derr)
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	// Fetched beside the snapshots, under a name no record has: a daemon
	// killed midway leaves an unknown entry the restart removes.
	if err := os.MkdirAll(m.cfg.SnapshotDir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(m.cfg.SnapshotDir, ".import-"+sn.ID+"-")
	if err != nil {
		return err
	}
	dir := filepath.Join(tmp, "image")
	if err := fetch(ctx, dir); err != nil {
		return errors.Join(fmt.Errorf("fetch snapshot %s: %w", sn.ID, err), os.RemoveAll(tmp))
	}
	m.crash.hit("xfork-import-fetched")
	// The fetch verified the files against the manifest; the manifest is
	// checked against the digest the owner named here, whoever sent it.
	got, _, err := snapstore.DigestOf(dir)
	if err == nil && got != d {
		err = errdefs.Wrap(errdefs.Conflict, fmt.Errorf("%w: snapshot %s: the fetched image's manifest is %s, not the %s asked for", stateimg.ErrCorrupt, sn.ID, got, d))
	}
	if err == nil {
		err = stateimg.VerifyAs(dir, "the fetched image of snapshot "+sn.ID)
	}
	if err == nil {
		err = os.Rename(dir, sn.Path)
	}
	if err != nil {
		return errors.Join(err, os.RemoveAll(tmp), os.RemoveAll(sn.Path))
	}
	_ = os.Remove(tmp)
	sn.SizeBytes = image.DirSize(sn.Path)
	if err := m.store.InsertSnapshot(ctx, sn); err != nil {
		return errors.Join(err, os.RemoveAll(sn.Path))
	}
	m.log.Info("snapshot imported", "snapshot", sn.ID, "digest", d, "size_mib", sn.SizeBytes>>20)
	return nil
}

// SendRoot writes the image root with identity id (RootID), which this
// node holds, to the writer w returns, as a root stream (image.SendRoot),
// for another node: NotFound before w is called if it holds none.
func (p *Porter) SendRoot(ctx context.Context, id string, w func() io.Writer) error {
	return p.m.images.SendRoot(ctx, id, w)
}

// validID checks a snapshot id a peer sent: it names a directory here.
func validID(id string) error {
	if !isID(id) {
		return errdefs.New(errdefs.InvalidArgument, "%.70q is not a snapshot id", id)
	}
	return nil
}
