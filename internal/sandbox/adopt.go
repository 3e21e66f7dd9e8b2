package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/store"
)

// sandboxFile is the file in a sealed sleep image that describes the
// sandbox (its whole record: image, shape, environment, options, traffic
// token, lifetimes): sealed with the image, so its digest covers it and
// at-rest encryption covers it too. A node that never saw the sandbox
// recreates its record from it when the cluster moves the sandbox there;
// nothing of it is ever put in the cluster's directory.
const sandboxFile = "clade-sandbox.json"

// movedRecord is sandboxFile's content.
type movedRecord struct {
	Version int           `json:"version"`
	Sandbox store.Sandbox `json:"sandbox"`
	// Root is the identity (RootID) of the image root the sandbox stands
	// on: a node that adopts it wakes it on that very root (its own image
	// if it is that root, else fetched from a node that holds it). ""
	// when the root is its node's only (a replaced image).
	Root string `json:"root,omitempty"`
}

// writeSandboxFile writes rec, standing on the root with identity root,
// into the sleep image in dir, before it is sealed.
func writeSandboxFile(dir string, rec store.Sandbox, root string) error {
	b, err := json.Marshal(movedRecord{Version: 1, Sandbox: rec, Root: root})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, sandboxFile), b, 0o600)
}

// movable says why rec cannot wake on another node, or nil.
func movable(rec store.Sandbox) error {
	switch {
	case len(rec.Opts.Volumes) > 0:
		return errdefs.New(errdefs.Conflict, "sandbox %s mounts volumes, which are its node's own: it wakes only on its node", rec.ID)
	case len(rec.Opts.Secrets) > 0:
		return errdefs.New(errdefs.Conflict, "sandbox %s takes secrets, which are its node's own: it wakes only on its node", rec.ID)
	}
	return nil
}

// Mover moves sleeping sandboxes between the nodes of a cluster: it tells
// the digest of a sleeping sandbox's image in the snapshot store, adopts
// a sandbox another node slept (its image fetched by digest, its record
// made from the image), and disowns the local copy of one the cluster
// moved away. It is a part over the Manager's locks, store and sleep
// images; the cluster (through service.Mover) decides who holds what.
type Mover struct{ m *Manager }

// NewMover returns the Mover of m.
func NewMover(m *Manager) *Mover { return &Mover{m: m} }

// SleepImage returns the digest of the sealed copy in the snapshot store
// of sleeping sandbox id's image: NotFound while there is none (no
// --object-store, or the copy not finished), Conflict for a sandbox that
// cannot move (volumes, secrets, a files-only sleep, an image of a daemon
// before images described their sandbox).
func (mv *Mover) SleepImage(ctx context.Context, id string) (snapstore.Digest, error) {
	m := mv.m
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	if rec.State != store.StateSleeping {
		return "", errdefs.New(errdefs.Conflict, "sandbox %s is %s, not asleep", id, rec.State)
	}
	if err := movable(rec); err != nil {
		return "", err
	}
	if m.cfg.Copies == nil {
		return "", errdefs.New(errdefs.NotFound, "sandbox %s's sleep image is on its node only (the node has no --object-store)", id)
	}
	d, err := m.cfg.Copies.Digest(sleepCopy(id))
	if err != nil {
		return "", err
	}
	// A sleep that kept only the files (no checkpoint), or an image of an
	// older daemon, has no description to be recreated from.
	if _, err := os.Stat(filepath.Join(m.cfg.sleepDir(id), sandboxFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	} else if errors.Is(err, os.ErrNotExist) {
		if _, derr := os.Stat(m.cfg.sleepDir(id)); derr == nil {
			return "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image does not describe the sandbox (slept by an older daemon): it wakes only on its node", id)
		}
	}
	return d, nil
}

// Adopt makes sandbox id, asleep, on this node from its image in the
// snapshot store: fetched by digest and verified, its record recreated
// from the image's description, on the very image root it stood on (this
// node's image if it is that root, else fetched with fetchRoot from a node
// that holds it, verified). The caller (the cluster) has claimed the
// sandbox for this node first; it wakes through the normal wake path.
// Adopting a sandbox this node already has returns it as it is. A daemon
// killed at any point leaves nothing half made: the fetch goes to a
// directory the next start removes, the record is written last.
func (mv *Mover) Adopt(ctx context.Context, id string, digest string, fetchRoot RootFetch) (store.Sandbox, error) {
	m := mv.m
	d, err := snapstore.Parse(digest)
	if err != nil {
		return store.Sandbox{}, err
	}
	if !isID(id) {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "bad sandbox id %q", id)
	}
	if m.cfg.Copies == nil {
		return store.Sandbox{}, errdefs.New(errdefs.Conflict, "sandbox %s is asleep on another node and this node has no --object-store to fetch its image from", id)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	if rec, err := m.store.GetSandbox(ctx, id); err == nil {
		return rec, nil
	} else if !errdefs.IsNotFound(err) {
		return store.Sandbox{}, err
	}
	if err := m.admission.checkDisk("move"); err != nil {
		return store.Sandbox{}, err
	}
	// Not a sandbox id: the start's reconcile removes it if the daemon
	// is killed before the rename.
	tmp := filepath.Join(m.cfg.SleepDir, ".adopt-"+id)
	if err := os.RemoveAll(tmp); err != nil {
		return store.Sandbox{}, err
	}
	if err := m.cfg.Copies.Fetch(ctx, d, tmp); err != nil {
		return store.Sandbox{}, errors.Join(fmt.Errorf("sandbox %s: fetch its sleep image %s from the snapshot store: %w", id, d, err), os.RemoveAll(tmp))
	}
	m.crash.hit("adopt-after-fetch")
	rec, root, err := readSandboxFile(tmp, id)
	if err == nil {
		err = movable(rec)
	}
	if err == nil {
		err = mv.fits(rec)
	}
	if err == nil && root == "" {
		err = errdefs.New(errdefs.Conflict, "sandbox %s's sleep image does not name the image root it stands on (its image was replaced on its node, or an older daemon slept it): it wakes only on its node", id)
	}
	if err != nil {
		return store.Sandbox{}, errors.Join(err, os.RemoveAll(tmp))
	}
	// Never another build of the image's name: a restore on other files
	// is wrong. Pinned until the record names it.
	img, release, err := m.images.rootFor(ctx, rec.Image, root, fetchRoot)
	if err != nil {
		return store.Sandbox{}, errors.Join(errdefs.Wrap(errdefs.ClassOf(err), fmt.Errorf("sandbox %s cannot wake on this node: %w", id, err)), os.RemoveAll(tmp))
	}
	defer release()
	// The snapshot it was forked from stays its first node's.
	rec.RootFS, rec.Snapshot = img.RootFS, ""
	rec.State, rec.Error, rec.EngineID, rec.Node = store.StateSleeping, "", "", ""
	dir := m.cfg.sleepDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return store.Sandbox{}, errors.Join(err, os.RemoveAll(tmp))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return store.Sandbox{}, errors.Join(err, os.RemoveAll(tmp))
	}
	m.crash.hit("adopt-before-record")
	// The copy is this node's now: the wake drops it once the sandbox
	// runs, as for a sandbox that slept here.
	if err := m.cfg.Copies.Claim(sleepCopy(id), d); err != nil {
		return store.Sandbox{}, errors.Join(fmt.Errorf("sandbox %s: record its sleep image's copy: %w", id, err), os.RemoveAll(dir))
	}
	if err := m.store.InsertSandbox(ctx, rec); err != nil {
		return store.Sandbox{}, errors.Join(err, m.cfg.Copies.Forget(sleepCopy(id)), os.RemoveAll(dir))
	}
	m.log.Info("sandbox moved here asleep", "sandbox", id, "digest", d)
	return m.store.GetSandbox(ctx, id)
}

// fits refuses a sandbox larger than this node takes (--max-memory,
// --max-cpus): its record then stays sleeping for another node.
func (mv *Mover) fits(rec store.Sandbox) error {
	c := mv.m.cfg
	if rec.MemoryMiB > c.MaxMemoryMiB || rec.CPUs > c.MaxCPUs {
		return errdefs.New(errdefs.ResourceExhausted, "sandbox %s has %d MiB and %g CPUs; this node takes sandboxes of at most %d MiB and %g CPUs (--max-memory, --max-cpus)",
			rec.ID, rec.MemoryMiB, rec.CPUs, c.MaxMemoryMiB, c.MaxCPUs)
	}
	return nil
}

// readSandboxFile reads the description of sandbox id in the sleep image
// in dir: it came from the snapshot store (verified against its digest,
// but written by another node), so it is checked as input.
func readSandboxFile(dir, id string) (store.Sandbox, string, error) {
	b, err := os.ReadFile(filepath.Join(dir, sandboxFile))
	if errors.Is(err, os.ErrNotExist) {
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image does not describe the sandbox (slept by an older daemon): it wakes only on its node", id)
	}
	if err != nil {
		return store.Sandbox{}, "", err
	}
	var mr movedRecord
	if err := json.Unmarshal(b, &mr); err != nil || mr.Version != 1 {
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image has a description this daemon cannot read (%v)", id, err)
	}
	rec := mr.Sandbox
	switch {
	case rec.ID != id:
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "the sleep image named for sandbox %s describes sandbox %q", id, rec.ID)
	case !image.ValidName(rec.Image):
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image names no usable image", id)
	case rec.MemoryMiB <= 0 || rec.CPUs < 0:
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image gives a bad shape (%d MiB, %g cpus)", id, rec.MemoryMiB, rec.CPUs)
	case mr.Root != "" && !validRootID(mr.Root):
		return store.Sandbox{}, "", errdefs.New(errdefs.Conflict, "sandbox %s's sleep image names a bad image root %.80q", id, mr.Root)
	}
	return rec, mr.Root, nil
}

// Disown removes this node's copy of sandbox id, which the cluster gave
// to another node: the engine sandbox, the sleep image and the record go
// as in a remove, but the copy in the snapshot store stays (the other
// node fetched or will fetch it). A sandbox this node does not have is
// NotFound.
func (mv *Mover) Disown(ctx context.Context, id string) error {
	m := mv.m
	if err := m.cfg.Copies.Forget(sleepCopy(id)); err != nil {
		return err
	}
	return m.Destroy(ctx, id)
}
