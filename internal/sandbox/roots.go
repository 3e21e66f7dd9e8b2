package sandbox

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
)

// Shipped roots: image roots this node fetched from another node of a
// cluster (by their identity, RootID) to restore a fork's children or wake
// a sandbox slept elsewhere, because it lacked the image or had another
// root of it. A shipped root is no image of this node (its own image of the
// same name, if any, stays as it is): it is kept under .rootfs/ like any
// root, named in this node's store by the sandboxes and snapshots that
// stand on it, and collected like any root once none does (gcRoots). What
// identity each shipped root has is a small file per root in the daemon's
// state (shipDir), written once the root is installed: a daemon killed
// midway leaves a build directory (removed by the image store at start)
// or a root no file names (pending, collected as unused).

// RootFetch opens a root stream (image.SendRoot) of the root with
// identity id from a node that holds it.
type RootFetch func(ctx context.Context, id string) (io.ReadCloser, error)

// Bounds of a root another node sends: bytes of its tree and entries.
var (
	maxShippedRootBytes   int64 = 64 << 30
	maxShippedRootEntries       = 4 << 20
)

// shippedFile is the content of a file in shipDir.
type shippedFile struct {
	Image  image.Image `json:"image"`
	RootFS string      `json:"rootfs"`
}

// validRootID reports whether id looks like a RootID.
func validRootID(id string) bool {
	h, ok := strings.CutPrefix(id, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// loadShipped reads shipDir once (from start): files whose root is gone
// are removed.
func (s *Images) loadShipped() error {
	s.rootMu.Lock()
	defer s.rootMu.Unlock()
	s.shipped = map[string]image.Image{}
	if s.shipDir == "" {
		return nil
	}
	ents, err := os.ReadDir(s.shipDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(s.shipDir, e.Name())
		id := "sha256:" + strings.TrimSuffix(e.Name(), ".json")
		var f shippedFile
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		if err == nil && (!validRootID(id) || RootID(f.Image) != id) {
			err = fmt.Errorf("names root %s, describes %s", id, RootID(f.Image))
		}
		if err == nil {
			_, err = os.Stat(f.RootFS)
		}
		if err != nil {
			s.log.Info("a shipped root's file is stale or unreadable: removed", "file", p, "err", err)
			_ = os.Remove(p)
			continue
		}
		f.Image.RootFS = f.RootFS
		s.shipped[id] = f.Image
	}
	return nil
}

// pinLocked keeps rootfs from collection until the returned func is
// called. Guarded by rootMu.
func (s *Images) pinLocked(rootfs string) func() {
	if s.rootPins == nil {
		s.rootPins = map[string]int{}
	}
	s.rootPins[rootfs]++
	done := false
	return func() {
		s.rootMu.Lock()
		defer s.rootMu.Unlock()
		if !done {
			done = true
			if s.rootPins[rootfs]--; s.rootPins[rootfs] <= 0 {
				delete(s.rootPins, rootfs)
			}
		}
	}
}

// shippedByRootLocked returns the shipped root at rootfs. Guarded by rootMu.
func (s *Images) shippedByRootLocked(rootfs string) (image.Image, bool) {
	for _, img := range s.shipped {
		if img.RootFS == rootfs {
			return img, true
		}
	}
	return image.Image{}, false
}

// rootFor returns the root with identity id of image name, pinned until
// release: this node's image name if it is that root, else a root shipped
// here before, else one fetched now with fetch (nil: none is) and
// installed. Two calls for one missing root fetch it once.
func (s *Images) rootFor(ctx context.Context, name, id string, fetch RootFetch) (image.Image, func(), error) {
	if !validRootID(id) {
		return image.Image{}, nil, errdefs.New(errdefs.InvalidArgument, "%.80q is not the identity of an image root", id)
	}
	if err := s.start(ctx); err != nil {
		return image.Image{}, nil, err
	}
	// Under useMu, as a create: the image's root is not collected
	// between reading it and pinning it.
	s.useMu.Lock()
	img, err := s.Get(ctx, name)
	if err == nil && RootID(img) == id {
		defer s.useMu.Unlock()
		s.rootMu.Lock()
		defer s.rootMu.Unlock()
		return img, s.pinLocked(img.RootFS), nil
	}
	s.useMu.Unlock()
	// One fetch of a root at a time: a second waits for the first (within
	// its context: a fetch that hangs holds up no one past theirs), then
	// uses what it installed or, if it failed, fetches itself.
	for {
		s.rootMu.Lock()
		if img, ok := s.shipped[id]; ok {
			defer s.rootMu.Unlock()
			return img, s.pinLocked(img.RootFS), nil
		}
		ch, busy := s.fetching[id]
		if !busy {
			if s.fetching == nil {
				s.fetching = map[string]chan struct{}{}
			}
			ch = make(chan struct{})
			s.fetching[id] = ch
			s.rootMu.Unlock()
			defer func() {
				s.rootMu.Lock()
				delete(s.fetching, id)
				s.rootMu.Unlock()
				close(ch)
			}()
			break
		}
		s.rootMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return image.Image{}, nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("waiting for this node's fetch of root %.19s of image %s: %w", id, name, ctx.Err()))
		}
	}
	here := "this node has no image " + name
	if err == nil {
		here = "this node's image " + name + " is another root (" + RootID(img)[:19] + ")"
	}
	if fetch == nil || s.shipDir == "" {
		return image.Image{}, nil, errdefs.New(errdefs.Conflict, "%s, and no node to fetch root %.19s of it from", here, id)
	}
	rc, err := fetch(ctx, id)
	if err != nil {
		return image.Image{}, nil, fmt.Errorf("%s: fetch root %.19s of it: %w", here, id, err)
	}
	defer rc.Close()
	t0 := time.Now()
	// A crash point once part of the root has landed (tests of restart
	// safety: the build directory is left for the next start).
	var in io.Reader = &hitAfter{r: rc, left: 1 << 20, hit: func() { s.crash.hit("ship-root-mid-fetch") }}
	got, err := s.files.ReceiveRoot(ctx, in, image.ReceiveOptions{MaxBytes: maxShippedRootBytes, MaxEntries: maxShippedRootEntries,
		Check: func(sent image.Image) error {
			// The name is part of a built root's identity, not of a
			// pulled one's (another node may call it otherwise).
			if RootID(sent) != id {
				return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%w: asked for root %.19s of image %s, sent root %.19s of image %.70q", image.ErrRootStream, id, name, RootID(sent), sent.Name))
			}
			return nil
		}})
	if err != nil {
		return image.Image{}, nil, fmt.Errorf("%s: fetch root %.19s of it: %w", here, id, err)
	}
	// The root is pending (OnRoot) until it is named here and pinned.
	if err := s.writeShipped(id, got); err != nil {
		return image.Image{}, nil, errors.Join(err, s.store.FinishPendingImageRoots(context.WithoutCancel(ctx), got.RootFS))
	}
	s.rootMu.Lock()
	s.shipped[id] = got
	release := s.pinLocked(got.RootFS)
	s.rootMu.Unlock()
	if err := s.store.FinishPendingImageRoots(context.WithoutCancel(ctx), got.RootFS); err != nil {
		release()
		return image.Image{}, nil, err
	}
	s.log.Info("image root shipped here", "image", name, "root", id, "rootfs", got.RootFS,
		"size_mib", image.DirSize(got.RootFS)>>20, "seconds", time.Since(t0).Seconds())
	return got, release, nil
}

// writeShipped records that the root at img.RootFS has identity id.
func (s *Images) writeShipped(id string, img image.Image) error {
	if err := os.MkdirAll(s.shipDir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(shippedFile{Image: img, RootFS: img.RootFS})
	if err != nil {
		return err
	}
	p := filepath.Join(s.shipDir, strings.TrimPrefix(id, "sha256:")+".json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// forgetShippedLocked drops what names the collected root rootfs, if it
// was a shipped one. Guarded by rootMu.
func (s *Images) forgetShippedLocked(rootfs string) {
	for id, img := range s.shipped {
		if img.RootFS == rootfs {
			delete(s.shipped, id)
			if err := os.Remove(filepath.Join(s.shipDir, strings.TrimPrefix(id, "sha256:")+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("remove a collected shipped root's file", "root", id, "err", err)
			}
		}
	}
}

// forRoot returns the image a sandbox or snapshot of image name standing
// on rootfs runs with (its configuration: environment, user, working
// directory), and whether rootfs is the image's current root (only then
// may the pools' sandboxes, made on that root, be used for it): the image
// itself, a root shipped here, or for a root the image no longer names,
// the image as it is now.
func (s *Images) forRoot(ctx context.Context, name, rootfs string) (image.Image, bool, error) {
	img, err := s.Get(ctx, name)
	if err == nil && (rootfs == "" || img.RootFS == rootfs) {
		return img, true, nil
	}
	s.rootMu.Lock()
	sh, ok := s.shippedByRootLocked(rootfs)
	s.rootMu.Unlock()
	if ok {
		return sh, false, nil
	}
	return img, false, err
}

// rootIdentity is the RootID of the root rootfs of image name, for
// another node: Conflict if the image no longer names that root and it was
// not shipped here (it is this node's only).
func (s *Images) rootIdentity(ctx context.Context, name, rootfs string) (string, error) {
	img, isCurrent, err := s.forRoot(ctx, name, rootfs)
	if err != nil {
		return "", err
	}
	if !isCurrent && img.RootFS != rootfs {
		return "", errdefs.New(errdefs.Conflict, "its image %s was replaced since: the root it stands on is this node's only", name)
	}
	return RootID(img), nil
}

// openRoot returns the image root with identity id that this node holds
// (an image's, or a shipped one), pinned until release, for another node
// to fetch: NotFound if there is none.
func (s *Images) openRoot(ctx context.Context, id string) (image.Image, func(), error) {
	if !validRootID(id) {
		return image.Image{}, nil, errdefs.New(errdefs.InvalidArgument, "%.80q is not the identity of an image root", id)
	}
	s.useMu.Lock()
	defer s.useMu.Unlock()
	imgs, err := s.List(ctx)
	if err != nil {
		return image.Image{}, nil, err
	}
	s.rootMu.Lock()
	defer s.rootMu.Unlock()
	for _, img := range imgs {
		if RootID(img) == id {
			if _, err := os.Stat(img.RootFS); err == nil {
				return img, s.pinLocked(img.RootFS), nil
			}
		}
	}
	if img, ok := s.shipped[id]; ok {
		return img, s.pinLocked(img.RootFS), nil
	}
	return image.Image{}, nil, errdefs.New(errdefs.NotFound, "this node holds no image root %.80s", id)
}

// SendRoot writes the root with identity id as a root stream
// (image.SendRoot) to w, for another node: NotFound before a byte is
// written if this node holds no such root.
func (s *Images) SendRoot(ctx context.Context, id string, w func() io.Writer) error {
	img, release, err := s.openRoot(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	return s.files.SendRoot(ctx, w(), img)
}

// hitAfter calls hit once left bytes have been read through it.
type hitAfter struct {
	r    io.Reader
	left int64
	hit  func()
}

func (h *hitAfter) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if h.left > 0 {
		if h.left -= int64(n); h.left <= 0 {
			h.hit()
		}
	}
	return n, err
}
