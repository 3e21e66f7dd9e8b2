package snapstore_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

// TestS3KeyID: daemons with the same key publish the same KeyID, another
// key or none another (nodes compare them before a move), the KeyID does
// not hold the key, and a fetch under another key says that the image may
// have been sealed under another host key and what to do.
func TestS3KeyID(t *testing.T) {
	t.Parallel() // a weed of its own: its start (~13 s) overlaps another test's
	srv := weedtest.Start(t)
	key, other := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(key)
	_, _ = rand.Read(other)
	a, bucket := newBucket(t, srv, key)
	open := func(k []byte) *snapstore.S3 {
		cfg := srv.Config(bucket)
		cfg.Key = k
		s, err := snapstore.NewS3(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	same, diff, plain := open(append([]byte(nil), key...)), open(other), open(nil)
	if a.KeyID() != same.KeyID() || !strings.HasPrefix(a.KeyID(), "sealed:") {
		t.Fatalf("one key, KeyIDs %q and %q", a.KeyID(), same.KeyID())
	}
	if diff.KeyID() == a.KeyID() || plain.KeyID() != snapstore.KeyPlain {
		t.Fatalf("KeyIDs: %q, another key %q, none %q", a.KeyID(), diff.KeyID(), plain.KeyID())
	}
	if id := strings.TrimPrefix(a.KeyID(), "sealed:"); len(id) != 16 || strings.Contains(hex.EncodeToString(key), id) {
		t.Fatalf("KeyID %q: want 8 bytes in hex, no part of the key", a.KeyID())
	}
	var c *snapstore.Copies
	if c.KeyID() != "" {
		t.Fatalf("a nil Copies' KeyID is %q, want empty", c.KeyID())
	}
	if cs, err := snapstore.NewCopies(a, t.TempDir(), nil); err != nil || cs.KeyID() != a.KeyID() {
		t.Fatalf("Copies' KeyID %q, the store's %q (%v)", cs.KeyID(), a.KeyID(), err)
	}

	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, "pages.img"), []byte("some pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := stateimg.Seal(img); err != nil {
		t.Fatal(err)
	}
	in, err := a.Put(t.Context(), img)
	if err != nil {
		t.Fatal(err)
	}
	err = diff.Fetch(t.Context(), in.Digest, filepath.Join(t.TempDir(), "img"))
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "sealed under another host key") || !strings.Contains(err.Error(), "--key-file") {
		t.Fatalf("a fetch under another key = %v, want a NotFound that names another host key", err)
	}
	if err := same.Fetch(t.Context(), in.Digest, filepath.Join(t.TempDir(), "img")); err != nil {
		t.Fatalf("a fetch under the same key: %v", err)
	}
}
