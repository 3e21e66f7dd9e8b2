package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// Images keeps the daemon's images: their records (name, reference,
// root, template snapshot) in the store, their root filesystems and layer
// blobs in the image directory. Builds (build.go) make images from
// sandboxes.
//
// The image directory may be shared by daemons with different data dirs
// (tests and `make demo` share one): each daemon records its own images,
// removes only roots it made (the store's image_roots), and adopts the
// images the directory describes itself (the default image, and those of
// versions that kept metadata in image.json) when its store lacks them.
type Images struct {
	files *image.Store
	store store.Images
	snaps store.Snapshots // a replaced template's snapshot is marked implicit
	log   *slog.Logger
	// life collects a replaced template's snapshot (the lifecycle's).
	life interface {
		gcSnapshot(ctx context.Context, id string)
	}
	// pools give back their sandboxes of a replaced image.
	pools interface {
		flushImage(ctx context.Context, name string)
	}

	// useMu orders an image removal (and a root collection) against
	// creates that use the image: a create holds it from reading the
	// image to recording its sandbox.
	useMu sync.Mutex
	// shipped are the roots other nodes sent here, by identity (roots.go),
	// rootPins the roots being sent or restored from: not collected.
	// Both guarded by rootMu (taken after useMu).
	rootMu   sync.Mutex
	shipped  map[string]image.Image
	rootPins map[string]int
	// shipDir holds a file per shipped root; fetching, the roots being
	// fetched (closed when the fetch ends; guarded by rootMu): a root is
	// fetched once at a time, another root beside it.
	shipDir  string
	fetching map[string]chan struct{}
	crash    crashPoints

	startMu sync.Mutex
	started bool // guarded by startMu

	buildMu  sync.Mutex
	building map[string]bool  // built-in images being built; guarded by buildMu
	failed   map[string]error // each built-in image's last failed build; guarded by buildMu
}

// buildBuiltin starts building the built-in image name in the background,
// once: a create that names one the image directory lacks starts its build
// and is told to retry.
//
// It returns the error of the last build that failed, if one did, so a
// user retrying is told why instead of waiting for ever.
func (s *Images) buildBuiltin(name string) error {
	s.buildMu.Lock()
	defer s.buildMu.Unlock()
	last := s.failed[name]
	if s.building[name] {
		return last
	}
	if s.building == nil {
		s.building, s.failed = map[string]bool{}, map[string]error{}
	}
	s.building[name] = true
	go func() {
		err := s.files.EnsureBuiltin(context.Background(), name)
		if err != nil {
			s.log.Error("building a built-in image failed; the next create that names it tries again", "image", name, "err", err)
		}
		s.buildMu.Lock()
		delete(s.building, name)
		if err != nil {
			s.failed[name] = err
		} else {
			delete(s.failed, name)
		}
		s.buildMu.Unlock()
	}()
	return last
}

func newImages(files *image.Store, st store.Images, snaps store.Snapshots, log *slog.Logger, life interface {
	gcSnapshot(ctx context.Context, id string)
}) *Images {
	files.OnRoot = func(rootfs string) error {
		// Recorded as pending before it exists: a root a killed daemon
		// never named is collected after the next start.
		return st.AddImageRoot(context.Background(), rootfs)
	}
	return &Images{files: files, store: st, snaps: snaps, log: log, life: life}
}

// start runs once per daemon, before the first image operation: it gives
// up the roots of installs a killed daemon left, and adopts the images the
// image directory describes that the store does not record (the migration
// from image.json files, and the default image a sibling daemon built).
func (s *Images) start(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	if s.started {
		return nil
	}
	if err := s.store.FinishPendingImageRoots(ctx); err != nil {
		return err
	}
	if err := s.loadShipped(); err != nil {
		return err
	}
	descs, err := s.files.Descriptors(ctx)
	if err != nil {
		return err
	}
	for _, img := range descs {
		if _, err := s.adopt(ctx, img); err != nil {
			return err
		}
	}
	s.started = true
	return nil
}

func (s *Images) adopt(ctx context.Context, img image.Image) (bool, error) {
	if img.Ref == "" && img.ManifestDigest != "" {
		// Pulled by a version that kept the reference only as the source.
		img.Ref = image.NormalizeRef(img.Source)
	}
	rec, err := toRecord(img)
	if err != nil {
		return false, err
	}
	ok, err := s.store.AdoptImage(ctx, rec)
	if ok {
		s.log.Info("image adopted from the image directory", "image", img.Name, "root", img.RootFS)
	}
	return ok, err
}

func toRecord(img image.Image) (store.Image, error) {
	meta, err := json.Marshal(img)
	if err != nil {
		return store.Image{}, err
	}
	return store.Image{Name: img.Name, Ref: img.Ref, Source: img.Source, RootFS: img.RootFS, Snapshot: img.Snapshot,
		SizeBytes: img.SizeBytes, Meta: meta, CreatedAt: img.CreatedAt}, nil
}

func fromRecord(rec store.Image) (image.Image, error) {
	var img image.Image
	if err := json.Unmarshal(rec.Meta, &img); err != nil {
		return image.Image{}, fmt.Errorf("image %s: %w", rec.Name, err)
	}
	img.Name, img.Ref, img.Source, img.RootFS, img.Snapshot = rec.Name, rec.Ref, rec.Source, rec.RootFS, rec.Snapshot
	img.SizeBytes, img.CreatedAt = rec.SizeBytes, rec.CreatedAt
	return img, nil
}

// maxRef bounds what a client may give as an image name or reference.
const maxRef = 512

// Get resolves ref, an image name or a reference it was pulled or imported
// as ("python:3.12-slim", "127.0.0.1:5000/team/app:v1"), to the image.
// InvalidArgument for a ref that can be neither; NotFound, saying how to
// pull it, for one the daemon does not have; Unavailable for the default
// image while it is being built.
func (s *Images) Get(ctx context.Context, ref string) (image.Image, error) {
	if err := checkImageRef(ref); err != nil {
		return image.Image{}, err
	}
	if err := s.start(ctx); err != nil {
		return image.Image{}, err
	}
	if image.ValidName(ref) {
		rec, err := s.store.GetImage(ctx, ref)
		if err == nil {
			return fromRecord(rec)
		}
		if !errdefs.IsNotFound(err) {
			return image.Image{}, err
		}
		// Built (the default image) by a sibling daemon since we started.
		if desc, err := s.files.Descriptor(ctx, ref); err == nil {
			if _, err := s.adopt(ctx, desc); err != nil {
				return image.Image{}, err
			}
			if rec, err := s.store.GetImage(ctx, ref); err == nil {
				return fromRecord(rec)
			}
		}
	}
	norm := image.NormalizeRef(ref)
	if norm == "" && !image.ValidName(ref) {
		return image.Image{}, errdefs.New(errdefs.InvalidArgument, "bad image %q: give an image name (see `clade image ls`) or a reference like registry/repo:tag", ref)
	}
	if norm != "" {
		rec, err := s.store.GetImageByRef(ctx, norm)
		if err == nil {
			return fromRecord(rec)
		}
		if !errdefs.IsNotFound(err) {
			return image.Image{}, err
		}
	}
	if ref == image.Default {
		return image.Image{}, errdefs.New(errdefs.Unavailable, "the default image is not built yet: the daemon builds it at start (this takes a few minutes once); retry shortly")
	}
	if r, ok := image.Builtin(ref); ok {
		if last := s.buildBuiltin(ref); last != nil {
			return image.Image{}, errdefs.New(errdefs.Unavailable, "the built-in image %s (%s) is being built again: its last build failed (%v); the daemon's log has the whole error; retry shortly", ref, r.About, last)
		}
		return image.Image{}, errdefs.New(errdefs.Unavailable, "the built-in image %s (%s) is being built from Debian's packages: this takes a few minutes, once; retry shortly", ref, r.About)
	}
	return image.Image{}, errdefs.New(errdefs.NotFound, "no image %q: pull it with `clade image pull %s`, or see `clade image ls`", ref, ref)
}

// checkImageRef refuses what cannot be an image name or reference before it
// reaches a query, a log or a message.
func checkImageRef(ref string) error {
	if ref == "" {
		return errdefs.New(errdefs.InvalidArgument, "no image: name one (see `clade image ls`)")
	}
	if len(ref) > maxRef {
		return errdefs.New(errdefs.InvalidArgument, "image reference of %d bytes: at most %d", len(ref), maxRef)
	}
	for _, c := range ref {
		if c <= ' ' || c == 0x7f || c > 0x7e {
			return errdefs.New(errdefs.InvalidArgument, "bad image %q: give an image name or a reference like registry/repo:tag", ref)
		}
	}
	return nil
}

// byName returns the image called name, if any.
func (s *Images) byName(ctx context.Context, name string) (image.Image, bool, error) {
	rec, err := s.store.GetImage(ctx, name)
	if errdefs.IsNotFound(err) {
		return image.Image{}, false, nil
	}
	if err != nil {
		return image.Image{}, false, err
	}
	img, err := fromRecord(rec)
	return img, err == nil, err
}

// List returns every image, by name.
func (s *Images) List(ctx context.Context) ([]image.Image, error) {
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	recs, err := s.store.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]image.Image, 0, len(recs))
	for _, rec := range recs {
		img, err := fromRecord(rec)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// Inspect returns the image ref names (see Images.Get) and the
// sandboxes and snapshots made from it.
func (s *Images) Inspect(ctx context.Context, ref string) (image.Image, []string, error) {
	img, err := s.Find(ctx, ref)
	if err != nil {
		return image.Image{}, nil, err
	}
	users, err := s.store.ImageUsers(ctx, img.Name)
	return img, users, err
}

// Find is Inspect without the users: the image's record only, read from
// the store's cache of image records. Listing the users is a query, which
// on the store's one connection waits for, and holds up, the writes of
// creates.
func (s *Images) Find(ctx context.Context, ref string) (image.Image, error) {
	img, err := s.Get(ctx, ref)
	if errdefs.IsUnavailable(err) {
		err = errdefs.New(errdefs.NotFound, "no image %q yet: the daemon is building it", ref)
	}
	return img, err
}

// install records img, just installed, as its name; an image of that name
// is replaced (sandboxes on it keep their root), and a replaced template's
// ready snapshot goes with its last user.
func (s *Images) install(ctx context.Context, img image.Image) (_ image.Image, err error) {
	defer s.gcRoots(ctx)
	rec, err := toRecord(img)
	if err == nil {
		var old store.Image
		var replaced bool
		old, replaced, err = s.store.PutImage(ctx, rec)
		if err == nil && replaced {
			s.replaced(ctx, old, img)
		}
	}
	if err != nil {
		// The root goes with the next collection.
		return image.Image{}, errors.Join(err, s.store.FinishPendingImageRoots(context.WithoutCancel(ctx), img.RootFS))
	}
	return img, nil
}

// replaced lets go of what the replaced image old held that img does not.
func (s *Images) replaced(ctx context.Context, old store.Image, img image.Image) {
	// The pools' sandboxes of the image stand on its former root, which
	// no record keeps: they go before the root collection (install's), and
	// the refills make new ones on the new root.
	s.pools.flushImage(ctx, old.Name)
	// A descriptor in the image directory would bring the old image back
	// at the next start; its root, which sandboxes may stand on, stays.
	if err := s.files.RemoveDescriptor(ctx, old.Name, true); err != nil {
		s.log.Warn("remove the replaced image's descriptor", "image", old.Name, "err", err)
	}
	if old.Snapshot != "" && old.Snapshot != img.Snapshot {
		if err := s.dropTemplateSnapshot(ctx, old.Snapshot); err != nil {
			s.log.Warn("remove the replaced template's snapshot", "snapshot", old.Snapshot, "err", err)
		}
	}
}

// gcStaleRoot collects roots after a sandbox or snapshot went, but only when
// it stood on a root its image no longer names: removing sandboxes of a
// current image (the common case, on the rm hot path) needs no scan.
func (s *Images) gcStaleRoot(ctx context.Context, imageName, rootfs string) {
	if rootfs == "" {
		return
	}
	if img, ok, err := s.byName(ctx, imageName); err == nil && ok && img.RootFS == rootfs {
		return
	}
	s.gcRoots(ctx)
}

// gcRoots removes the image roots this daemon made that no image names and
// no sandbox or snapshot stands on (the roots of replaced and removed
// images, once unused, and of installs that never finished), then the
// blobs no image uses.
func (s *Images) gcRoots(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	// Creates hold useMu from reading an image's root to recording it.
	s.useMu.Lock()
	roots, err := s.store.CollectImageRoots(ctx)
	if err == nil {
		s.rootMu.Lock()
		roots, err = s.keepPinnedLocked(ctx, roots)
		s.rootMu.Unlock()
	}
	s.useMu.Unlock()
	if err != nil {
		s.log.Warn("image root collection", "err", err)
		return
	}
	for _, r := range roots {
		if err := s.files.RemoveRoot(r); err != nil {
			s.log.Warn("remove image root", "root", r, "err", err)
		}
	}
	used := map[string]bool{}
	imgs, err := s.List(ctx)
	if err != nil {
		return // better to keep every blob than to lose ones an image uses
	}
	descs, err := s.files.Descriptors(ctx)
	if err != nil {
		return
	}
	for _, img := range append(imgs, descs...) {
		for _, l := range img.Layers {
			used[l] = true
		}
	}
	if err := s.files.GCBlobs(used); err != nil {
		s.log.Warn("image blob collection", "err", err)
	}
}

// keepPinnedLocked returns roots (collected) but those pinned, which it
// records again (collectable once unpinned and unused); the others stop
// being shipped roots. Guarded by useMu and rootMu.
func (s *Images) keepPinnedLocked(ctx context.Context, roots []string) ([]string, error) {
	var out []string
	for _, r := range roots {
		if s.rootPins[r] > 0 {
			// Never removed while pinned; a failed record only means
			// this daemon never collects it (disk, not correctness).
			err := s.store.AddImageRoot(ctx, r)
			if err == nil {
				err = s.store.FinishPendingImageRoots(ctx, r)
			}
			if err != nil {
				s.log.Warn("record a pinned image root again", "root", r, "err", err)
			}
			continue
		}
		s.forgetShippedLocked(r)
		out = append(out, r)
	}
	return out, nil
}

// Users lists the sandboxes and snapshots made from the image called
// name: its rootfs is their lower layer, so it must outlive them.
func (s *Images) Users(ctx context.Context, name string) ([]string, error) {
	return s.store.ImageUsers(ctx, name)
}

// Remove removes the image ref names (see Images.Get) if no
// sandbox or snapshot uses it: Conflict, naming them, if one does.
func (s *Images) Remove(ctx context.Context, ref string) error {
	img, err := s.Get(ctx, ref)
	if errdefs.IsUnavailable(err) {
		return errdefs.New(errdefs.NotFound, "no image %q", ref)
	}
	if err != nil {
		return err
	}
	// The store checks the users and removes in one transaction; useMu
	// keeps out creates that read the image and have not recorded their
	// sandbox yet.
	s.useMu.Lock()
	rec, err := s.store.DeleteImage(ctx, img.Name)
	s.useMu.Unlock()
	if err != nil {
		return err
	}
	// Unused here, so its descriptor (and an old image's root inside it)
	// can go.
	err = s.files.RemoveDescriptor(ctx, img.Name, false)
	err = errors.Join(err, s.dropTemplateSnapshot(ctx, rec.Snapshot))
	s.gcRoots(ctx)
	return err
}

// dropTemplateSnapshot lets go of a template's former ready snapshot: it
// goes now if no sandbox was restored from it, else with the last of them
// (which keep working).
func (s *Images) dropTemplateSnapshot(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if err := s.snaps.SetSnapshotImplicit(ctx, id); err != nil {
		return err
	}
	s.life.gcSnapshot(ctx, id)
	return nil
}

// Pull pulls an image. Replacing an image of the same name is safe
// while sandboxes use it: they keep standing on the root they were made on.
func (s *Images) Pull(ctx context.Context, ref string, opts image.PullOptions) (image.Image, error) {
	if err := s.start(ctx); err != nil {
		return image.Image{}, err
	}
	if opts.Name == "" {
		opts.Name = image.DefaultName(ref)
	}
	if opts.Name != "" {
		cur, _, err := s.byName(ctx, opts.Name)
		if err != nil {
			return image.Image{}, err
		}
		opts.Current = cur
	}
	img, err := s.files.Pull(ctx, ref, opts)
	if err != nil {
		return image.Image{}, err
	}
	if img.RootFS == opts.Current.RootFS {
		return img, nil // the same manifest: nothing changed
	}
	return s.install(ctx, img)
}

// Import imports an image archive, like Pull.
func (s *Images) Import(ctx context.Context, path string, opts image.ImportOptions) (image.Image, error) {
	if err := s.start(ctx); err != nil {
		return image.Image{}, err
	}
	img, err := s.files.Import(ctx, path, opts)
	if err != nil {
		return image.Image{}, err
	}
	return s.install(ctx, img)
}
