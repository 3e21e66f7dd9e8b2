package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// RecordRootSum records the sum of root id's stream as just uploaded,
// unconditionally (an upload records it under the root's lock:
// RootLock.RecordSum).
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

// The lock on a root's object and sum (snapstore.RootSums.LockRoot):
// root-locks/HEX, put only while absent and bound to the holder's lease,
// whose value is the holder's node and this process's token. The writes
// made under it (the sum's record or delete) hold only while that very
// key is there (its create revision): a holder whose lease lapsed writes
// nothing. Uploads of a root, the sweep's delete of it and a wake's delete
// of a bad one take it, so none lands between another's look and write.

func rootLockKey(id string) string {
	return keyPrefix + "root-locks/" + strings.TrimPrefix(id, "sha256:")
}

// lockToken names this process's locks: a lock of this node's lease
// with another token was left by an earlier run of the daemon (killed
// mid-upload, back on the same lease), and is broken.
func (c *Cluster) lockToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.token = c.cfg.Node + "/" + hex.EncodeToString(b[:])
	}
	return c.token
}

// LockRoot implements snapstore.RootSums.
func (c *Cluster) LockRoot(ctx context.Context, id string, waiting func()) (snapstore.RootLock, error) {
	if !validRootID(id) {
		return nil, errdefs.New(errdefs.InvalidArgument, "%.80q is not the identity of an image root", id)
	}
	k, token := rootLockKey(id), c.lockToken()
	for {
		c.mu.Lock()
		lease := c.lease
		c.mu.Unlock()
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := c.cli.Txn(octx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, token, clientv3.WithLease(lease))).Else(clientv3.OpGet(k)).Commit()
		cancel()
		if err != nil {
			return nil, unavailable("lock image root "+id[:19], err)
		}
		if r.Succeeded {
			return &rootLock{c: c, key: k, sumKey: rootSumKey(id), rev: r.Header.Revision}, nil
		}
		var kv = r.Responses[0].GetResponseRange().Kvs
		if len(kv) == 1 && clientv3.LeaseID(kv[0].Lease) == lease && string(kv[0].Value) != token {
			// This node's lease, an earlier run's lock: broken.
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", kv[0].ModRevision)).Then(clientv3.OpDelete(k)).Commit()
			cancel()
			if err != nil {
				return nil, unavailable("lock image root "+id[:19], err)
			}
			continue
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		// Until the holder lets go (or its lease lapses).
		wctx, wcancel := context.WithCancel(ctx)
		for resp := range c.cli.Watch(wctx, k, clientv3.WithRev(r.Header.Revision+1)) {
			if resp.Err() != nil || slicesHasDelete(resp.Events) {
				break
			}
		}
		wcancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

func slicesHasDelete(evs []*clientv3.Event) bool {
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			return true
		}
	}
	return false
}

type rootLock struct {
	c           *Cluster
	key, sumKey string
	rev         int64 // the lock key's create revision
}

func (l *rootLock) write(ctx context.Context, what string, op clientv3.Op) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := l.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)).Then(op).Commit()
	if err != nil {
		return unavailable(what, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("cluster: %s: %w", what, snapstore.ErrRootLockLost)
	}
	return nil
}

// RecordSum implements snapstore.RootLock.
func (l *rootLock) RecordSum(ctx context.Context, sum []byte) error {
	if len(sum) != sha256.Size {
		return errdefs.New(errdefs.InvalidArgument, "a root sum of %d bytes", len(sum))
	}
	return l.write(ctx, "record the digest of an image root", clientv3.OpPut(l.sumKey, hex.EncodeToString(sum)))
}

// DropSum implements snapstore.RootLock.
func (l *rootLock) DropSum(ctx context.Context) error {
	return l.write(ctx, "delete the digest of an image root", clientv3.OpDelete(l.sumKey))
}

// Unlock implements snapstore.RootLock.
func (l *rootLock) Unlock() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)).Then(clientv3.OpDelete(l.key)).Commit(); err != nil {
		l.c.cfg.Log.Warn("cluster: unlock an image root (the lock goes with this node's lease)", "key", l.key, "err", err)
	}
}
