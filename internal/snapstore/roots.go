package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/minio/minio-go/v7"
)

// Image roots in the store: a sleep image (or a snapshot) restores only on
// the very image root it was checkpointed on, which other nodes may not
// hold. So with the image, the store keeps its root, once per root
// identity (the RootID the image's description names), in the root stream
// format nodes send each other (image.SendRoot: a descriptor, a framed tar,
// its SHA-256), which the receiver checks as hostile input whatever sent
// it. Under PREFIX:
//
//	roots/NAME/root         the root stream (sealed when encrypted)
//	roots/NAME/refs/IMAGE   one empty object per stored image that names
//	                        the root: what keeps it
//	IMAGEBASE/root          the root's identity, in the image's own prefix
//	                        (so dropping the image finds its root)
//
// NAME is sha256-HEX of the identity, or e-HMAC when encrypted (as images:
// the bucket learns no identity). A root object is put whole (an S3 PUT is
// atomic) and streaming (a multipart upload of 16 MiB parts, two in memory at
// most). Once the last image naming it is deleted (UnrefRoot)
// it is deleted too, after a grace (Copies): never while a ref names it
// (the sweep sets it aside, looks at the refs again, and puts it back if
// one appeared). A root that does not verify is deleted by the node that
// read it (Copies.DropBadRoot), and the next copy of an image on it puts
// it back. The directory store (Local) keeps roots the same way, under
// its root directory (roots.go's layout, with image-roots/sha256-HEX for
// IMAGEBASE/root, as its images are directories).

// RootStore is a Store that also keeps image roots (S3 and Local do).
type RootStore interface {
	// HasRoot reports whether the root with identity id is stored.
	HasRoot(ctx context.Context, id string) (bool, error)
	// PutRoot stores the root stream send writes as the root id.
	PutRoot(ctx context.Context, id string, send func(w io.Writer) error) error
	// OpenRoot opens the stored root stream of id (NotFound if none; an
	// error wrapping ErrBadRoot if it cannot be opened at all: sealed
	// under no key this node has, its header damaged).
	// The caller verifies what it reads.
	OpenRoot(ctx context.Context, id string) (io.ReadCloser, error)
	// RefRoot records that stored image d stands on root id.
	RefRoot(ctx context.Context, id string, d Digest) error
	// UnrefRoot drops image d's ref (before d is deleted): the root's
	// identity ("" if d named none) and whether no image names it now.
	UnrefRoot(ctx context.Context, d Digest) (id string, unneeded bool, err error)
	// RootNamed reports whether any stored image names root id.
	RootNamed(ctx context.Context, id string) (bool, error)
	// SetRootAside moves root id's object to a name of the sweeper's own
	// (tag), where HasRoot and OpenRoot do not see it, and reports
	// whether there was one.
	SetRootAside(ctx context.Context, id, tag string) (bool, error)
	// RestoreRoot puts the object of root id set aside as tag back,
	// unless a root was stored meanwhile, then deletes the set-aside
	// one. None set aside is not an error.
	RestoreRoot(ctx context.Context, id, tag string) error
	// DropRootAside deletes the object of root id set aside as tag.
	DropRootAside(ctx context.Context, id, tag string) error
	// DeleteRoot deletes root id's object, whatever names it (one that
	// did not verify: the next copy of an image on it uploads it anew).
	DeleteRoot(ctx context.Context, id string) error
}

// ErrBadRoot marks a stored root object that cannot be read at all (not
// one whose bytes are refused: the reader checks those).
var ErrBadRoot = errors.New("the stored image root cannot be opened")

var (
	_ RootStore = (*S3)(nil)
	_ RootStore = (*Local)(nil)
)

// validRoot checks an image root's identity (RootID: sha256:HEX).
func validRoot(id string) error {
	if _, err := Parse(id); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "%.80q is not the identity of an image root", id)
	}
	return nil
}

func (s *S3) rootBase(id string) string {
	if s.seal != nil {
		return s.prefix + "roots/" + s.seal.prefix(Digest(id)) + "/"
	}
	return s.prefix + "roots/sha256-" + Digest(id).hex() + "/"
}

func (s *S3) refName(d Digest) string {
	if s.seal != nil {
		return s.seal.prefix(d)
	}
	return "sha256-" + d.hex()
}

// HasRoot implements RootStore.
func (s *S3) HasRoot(ctx context.Context, id string) (bool, error) {
	if err := validRoot(id); err != nil {
		return false, err
	}
	_, err := s.cli.StatObject(ctx, s.bucket, s.rootBase(id)+"root", minio.StatObjectOptions{})
	if noSuchKey(err) {
		return false, nil
	}
	if err != nil {
		return false, s.unavailable("stat root "+short(Digest(id)), err)
	}
	return true, nil
}

// PutRoot implements RootStore.
func (s *S3) PutRoot(ctx context.Context, id string, send func(w io.Writer) error) error {
	if err := validRoot(id); err != nil {
		return err
	}
	key := s.rootBase(id) + "root"
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(send(pw)) }()
	defer pr.Close()
	var r io.Reader = pr
	if s.seal != nil {
		er, err := s.seal.encrypt(pr, -1, key) // a stream: its length is unknown
		if err != nil {
			return err
		}
		r = er
	}
	// Unknown size: minio uploads it in parts of PartSize, filling one
	// buffer while the other is sent (two buffers: 32 MiB, whatever the
	// root's size). A send that fails fails the upload, which is then
	// aborted: no object is made.
	_, err := s.cli.PutObject(ctx, s.bucket, key, r, -1, minio.PutObjectOptions{
		ContentType: "application/octet-stream", PartSize: 16 << 20, NumThreads: 2, ConcurrentStreamParts: true,
	})
	if err != nil {
		return s.unavailable("put root "+short(Digest(id)), err)
	}
	return nil
}

// OpenRoot implements RootStore.
func (s *S3) OpenRoot(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := validRoot(id); err != nil {
		return nil, err
	}
	r, err := s.get(ctx, s.rootBase(id)+"root")
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, errdefs.New(errdefs.NotFound, "image root %s is not in the object store %s", short(Digest(id)), s.endpoint)
	case errors.Is(err, errSealed):
		return nil, errdefs.Wrap(errdefs.Conflict, fmt.Errorf("image root %s in the object store: %w: %w", short(Digest(id)), ErrBadRoot, err))
	case err != nil:
		return nil, err
	}
	return r, nil
}

// RefRoot implements RootStore.
func (s *S3) RefRoot(ctx context.Context, id string, d Digest) error {
	if err := validRoot(id); err != nil {
		return err
	}
	if err := s.put(ctx, s.rootBase(id)+"refs/"+s.refName(d), strings.NewReader(""), 0); err != nil {
		return err
	}
	return s.put(ctx, s.base(d)+"root", strings.NewReader(id), int64(len(id)))
}

// UnrefRoot implements RootStore.
func (s *S3) UnrefRoot(ctx context.Context, d Digest) (string, bool, error) {
	r, err := s.get(ctx, s.base(d)+"root")
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	b, err := io.ReadAll(io.LimitReader(r, 128))
	r.Close()
	if err != nil {
		return "", false, s.unavailable("read the root of "+short(d), err)
	}
	id := string(b)
	if validRoot(id) != nil {
		return "", false, fmt.Errorf("stored image %s names a bad image root %.80q", short(d), id)
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, s.rootBase(id)+"refs/"+s.refName(d), minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return id, false, s.unavailable("drop a ref of root "+short(Digest(id)), err)
	}
	named, err := s.rootNamed(ctx, id)
	return id, err == nil && !named, err
}

// RootNamed implements RootStore.
func (s *S3) RootNamed(ctx context.Context, id string) (bool, error) {
	if err := validRoot(id); err != nil {
		return false, err
	}
	return s.rootNamed(ctx, id)
}

// rootNamed reports whether any image names root id.
func (s *S3) rootNamed(ctx context.Context, id string) (bool, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the lister's goroutine
	for o := range s.cli.ListObjects(lctx, s.bucket, minio.ListObjectsOptions{Prefix: s.rootBase(id) + "refs/", MaxKeys: 1}) {
		if o.Err != nil {
			return false, s.unavailable("list the refs of root "+short(Digest(id)), o.Err)
		}
		return true, nil
	}
	return false, nil
}

// validTag checks a sweeper's tag (a name of its own for a root set
// aside).
func validTag(tag string) error {
	if tag == "" || len(tag) > 64 || strings.Trim(tag, "0123456789abcdef") != "" {
		return errdefs.New(errdefs.InvalidArgument, "%.80q is not a tag of a root set aside", tag)
	}
	return nil
}

// aside is the name of root id's object set aside as tag. Its bytes are
// the root's (sealed under the root's name: they open only back there).
func (s *S3) aside(id, tag string) string { return s.rootBase(id) + "aside-" + tag }

// SetRootAside implements RootStore. S3 has no rename: a server-side
// copy, then the delete.
func (s *S3) SetRootAside(ctx context.Context, id, tag string) (bool, error) {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return false, err
	}
	if err := s.copyObject(ctx, s.rootBase(id)+"root", s.aside(id, tag)); err != nil {
		if noSuchKey(err) {
			return false, nil
		}
		return false, s.unavailable("set root "+short(Digest(id))+" aside", err)
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, s.rootBase(id)+"root", minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return true, s.unavailable("set root "+short(Digest(id))+" aside", err)
	}
	return true, nil
}

// RestoreRoot implements RootStore.
func (s *S3) RestoreRoot(ctx context.Context, id, tag string) error {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return err
	}
	has, err := s.HasRoot(ctx, id)
	if err != nil {
		return err
	}
	if !has {
		if err := s.copyObject(ctx, s.aside(id, tag), s.rootBase(id)+"root"); err != nil {
			if noSuchKey(err) {
				return nil // none set aside
			}
			return s.unavailable("put root "+short(Digest(id))+" back", err)
		}
	}
	return s.DropRootAside(ctx, id, tag)
}

// DropRootAside implements RootStore.
func (s *S3) DropRootAside(ctx context.Context, id, tag string) error {
	if err := errors.Join(validRoot(id), validTag(tag)); err != nil {
		return err
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, s.aside(id, tag), minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return s.unavailable("delete root "+short(Digest(id))+" set aside", err)
	}
	return nil
}

// DeleteRoot implements RootStore.
func (s *S3) DeleteRoot(ctx context.Context, id string) error {
	if err := validRoot(id); err != nil {
		return err
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, s.rootBase(id)+"root", minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return s.unavailable("delete root "+short(Digest(id)), err)
	}
	return nil
}

// copyObject copies object src to dst within the bucket, server-side
// (ComposeObject: any size, in parts past 5 GiB).
func (s *S3) copyObject(ctx context.Context, src, dst string) error {
	_, err := s.cli.ComposeObject(ctx, minio.CopyDestOptions{Bucket: s.bucket, Object: dst},
		minio.CopySrcOptions{Bucket: s.bucket, Object: src})
	return err
}
