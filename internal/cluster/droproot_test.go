package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/image"
)

type failingReader struct{ r io.Reader }

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("read tcp: connection reset by peer")
	}
	return n, err
}

// TestStoreRootKeptUnlessShownBad: a wake or fork that refuses an image
// root read from the object store deletes the store's copy only when its
// bytes do not hash to the sum recorded at its upload. A read of the store
// that failed midway (refused as a cut stream, image.ErrRootStream) used
// to delete a good copy, which may be the only one left of a root whose
// node is gone: every sandbox asleep on it could then wake nowhere.
func TestStoreRootKeptUnlessShownBad(t *testing.T) {
	cli := startEtcd(t)
	good := []byte(strings.Repeat("a good root stream ", 1000))
	var mu sync.Mutex
	stored := map[string][]byte{}
	failRead := false
	var deleted []string
	id := "sha256:" + strings.Repeat("ab", 32)
	c, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:1", LeaseTTL: 3 * time.Second,
		Log: slog.New(slog.DiscardHandler),
		Capacity: func(context.Context) (api.NodeCapacity, error) {
			return api.NodeCapacity{Cores: 2, Sandboxes: 1}, nil
		},
		StoreRoot: func(ctx context.Context, id string) (io.ReadCloser, error) {
			mu.Lock()
			defer mu.Unlock()
			var r io.Reader = bytes.NewReader(stored[id])
			if failRead {
				r = failingReader{io.LimitReader(r, 100)}
			}
			return io.NopCloser(r), nil
		},
		StoreRootBad: func(ctx context.Context, id string, why error) {
			mu.Lock()
			defer mu.Unlock()
			deleted = append(deleted, id)
			delete(stored, id)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(good)
	if err := c.RecordRootSum(t.Context(), id, sum[:]); err != nil {
		t.Fatal(err)
	}
	stored[id] = good
	refusal := func() error {
		rc, err := c.storeRoot(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		_, err = io.Copy(io.Discard, rc)
		return errors.Join(image.ErrRootStream, err)
	}

	// A read that fails midway: the copy is good, and kept.
	failRead = true
	c.dropStoreRoot(t.Context(), id, refusal())
	failRead = false
	// A refusal for this node's own limits: kept too.
	c.dropStoreRoot(t.Context(), id, errors.Join(image.ErrRootStream, errors.New("the root is over the limit of 10 bytes")))
	if len(deleted) != 0 || stored[id] == nil {
		t.Fatalf("a good copy of the root refused for a failed read or this node's limits was deleted")
	}
	// A forged copy (written by someone with write access to the bucket)
	// is deleted.
	mu.Lock()
	stored[id] = []byte(strings.Repeat("a forged root stream", 1000))
	mu.Unlock()
	c.dropStoreRoot(t.Context(), id, refusal())
	if len(deleted) != 1 || stored[id] != nil {
		t.Fatalf("a forged copy of the root refused: deleted %v, want it deleted", deleted)
	}
}
