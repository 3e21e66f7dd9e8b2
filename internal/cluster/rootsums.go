package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
)

// The image roots in the object store are checked against a digest the
// cluster keeps: roots/HEX holds the SHA-256 (hex) of the root stream the
// last upload of root sha256:HEX sent (snapstore.RootSums). The stream's
// own SHA-256 (image.ReceiveRoot) is the sender's, and a root read from the
// store was sent by whoever could write the store: without this, a writer
// of the bucket could hand any node a root of its choosing.

func rootSumKey(id string) string {
	return keyPrefix + "roots/" + strings.TrimPrefix(id, "sha256:")
}

// RecordRootSum implements snapstore.RootSums: the sum of root id's
// stream as just uploaded.
func (c *Cluster) RecordRootSum(ctx context.Context, id string, sum []byte) error {
	if len(sum) != sha256.Size || !validRootID(id) {
		return errdefs.New(errdefs.InvalidArgument, "a root sum of %d bytes for %.80q", len(sum), id)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.cli.Put(ctx, rootSumKey(id), hex.EncodeToString(sum)); err != nil {
		return unavailable("record the digest of image root "+id[:19], err)
	}
	return nil
}

// RootSum implements snapstore.RootSums: nil if none is recorded.
func (c *Cluster) RootSum(ctx context.Context, id string) ([]byte, error) {
	if !validRootID(id) {
		return nil, errdefs.New(errdefs.InvalidArgument, "%.80q is not the identity of an image root", id)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.cli.Get(ctx, rootSumKey(id))
	if err != nil {
		return nil, unavailable("read the digest of image root "+id[:19], err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	sum, err := hex.DecodeString(string(r.Kvs[0].Value))
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("cluster: the digest recorded for image root %s is malformed", id[:19])
	}
	return sum, nil
}

func validRootID(id string) bool {
	h, ok := strings.CutPrefix(id, "sha256:")
	if !ok || len(h) != 2*sha256.Size || strings.ToLower(h) != h {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// sumReader passes a root stream on, hashing it, and holds back its last
// bytes until the stream ended and its SHA-256 matched want: a reader of
// the stream (image.ReceiveRoot) never gets the stream's end, its own
// digest included, from a stream that is not the one recorded.
type sumReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want []byte
	held []byte // read, not given yet
	buf  []byte
	ok   bool // the stream ended and matched
	err  error
}

// sumHold is how many bytes are held back: more than a stream's end (a
// frame of 0 and the 32-byte digest).
const sumHold = 64

func newSumReader(rc io.ReadCloser, want []byte) *sumReader {
	return &sumReader{rc: rc, h: sha256.New(), want: want, buf: make([]byte, 64<<10)}
}

func (s *sumReader) Read(p []byte) (int, error) {
	for {
		switch {
		case s.err != nil:
			return 0, s.err
		case s.ok && len(s.held) == 0:
			return 0, io.EOF
		case s.ok:
			n := copy(p, s.held)
			s.held = s.held[n:]
			return n, nil
		case len(s.held) > sumHold:
			n := copy(p, s.held[:len(s.held)-sumHold])
			s.held = s.held[n:]
			return n, nil
		}
		k, err := s.rc.Read(s.buf)
		s.h.Write(s.buf[:k])
		s.held = append(s.held, s.buf[:k]...)
		switch {
		case err == io.EOF && bytes.Equal(s.h.Sum(nil), s.want):
			s.ok = true
		case err == io.EOF:
			s.err = errSumMismatch{}
		case err != nil:
			s.err = err
		}
	}
}

func (s *sumReader) Close() error { return s.rc.Close() }

// errSumMismatch is a bad root stream (image.ErrRootStream), said without
// its prefix: the receiver says it (image's badStream).
type errSumMismatch struct{}

func (errSumMismatch) Error() string {
	return "its SHA-256 is not the one the cluster recorded when it was uploaded"
}

func (errSumMismatch) Unwrap() error { return image.ErrRootStream }
