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
// it is deleted too, after a grace (Copies): never while a ref names it.

// RootStore is a Store that also keeps image roots (S3 does).
type RootStore interface {
	// HasRoot reports whether the root with identity id is stored.
	HasRoot(ctx context.Context, id string) (bool, error)
	// PutRoot stores the root stream send writes as the root id.
	PutRoot(ctx context.Context, id string, send func(w io.Writer) error) error
	// OpenRoot opens the stored root stream of id (NotFound if none).
	// The caller verifies what it reads.
	OpenRoot(ctx context.Context, id string) (io.ReadCloser, error)
	// RefRoot records that stored image d stands on root id.
	RefRoot(ctx context.Context, id string, d Digest) error
	// UnrefRoot drops image d's ref (before d is deleted): the root's
	// identity ("" if d named none) and whether no image names it now.
	UnrefRoot(ctx context.Context, d Digest) (id string, unneeded bool, err error)
	// DeleteRootUnneeded deletes root id if no image names it (a ref
	// written since keeps it), and reports whether it did.
	DeleteRootUnneeded(ctx context.Context, id string) (bool, error)
}

var _ RootStore = (*S3)(nil)

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
		return nil, errdefs.New(errdefs.Conflict, "image root %s in the object store: %v", short(Digest(id)), err)
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

// DeleteRootUnneeded implements RootStore.
func (s *S3) DeleteRootUnneeded(ctx context.Context, id string) (bool, error) {
	if err := validRoot(id); err != nil {
		return false, err
	}
	if named, err := s.rootNamed(ctx, id); err != nil || named {
		return false, err
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, s.rootBase(id)+"root", minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return false, s.unavailable("delete root "+short(Digest(id)), err)
	}
	return true, nil
}
