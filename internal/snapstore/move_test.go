package snapstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

// TestCopiesMove: what a move uses. Node a copies an image; node b (its
// own records, the same store) fetches it by digest and claims it; a
// forgets its copy and the object stays (b relies on it); b's Drop, the
// last record naming it, deletes it.
func TestCopiesMove(t *testing.T) {
	base := t.TempDir()
	st, err := snapstore.NewLocal(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := snapstore.NewCopies(st, filepath.Join(base, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := snapstore.NewCopies(st, filepath.Join(base, "b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	img := storetest.MakeImage(t, filepath.Join(base, "sleep-a", "sb1"), 1<<20)
	a.Put("sleep/sb1", img)
	if err := a.Wait(t.Context(), "sleep/sb1"); err != nil {
		t.Fatal(err)
	}
	d, err := a.Digest("sleep/sb1")
	if err != nil {
		t.Fatal(err)
	}
	into := filepath.Join(base, "sleep-b", "sb1")
	if err := b.Fetch(t.Context(), d, into); err == nil {
		t.Fatal("a fetch into a dir whose parent is missing succeeded")
	}
	if err := os.MkdirAll(filepath.Dir(into), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := b.Fetch(t.Context(), d, into); err != nil {
		t.Fatal(err)
	}
	if err := stateimg.Verify(into); err != nil {
		t.Fatal(err)
	}
	missing := snapstore.Digest("sha256:" + strings.Repeat("0", 64))
	if err := b.Claim("sleep/sb1", missing); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("claim of an image the store lacks = %v, want NotFound", err)
	}
	if err := b.Claim("sleep/sb1", d); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Digest("sleep/sb1"); err != nil || got != d {
		t.Fatalf("b's record after the claim = %s, %v", got, err)
	}
	// a forgets: its record goes, the object stays.
	if err := a.Forget("sleep/sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Digest("sleep/sb1"); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("a's record after Forget = %v", err)
	}
	a.Close() // waits for any background work
	if _, err := st.Stat(t.Context(), d); err != nil {
		t.Fatalf("the object after a's Forget = %v, want it kept", err)
	}
	// b's wake drops it: the last record, so the object goes.
	if err := b.Drop("sleep/sb1"); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := st.Stat(t.Context(), d); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("the object after b's Drop = %v, want NotFound", err)
	}
	var nilCopies *snapstore.Copies
	if nilCopies.Forget("sleep/x") != nil || nilCopies.Claim("sleep/x", d) == nil || nilCopies.Fetch(t.Context(), d, into) == nil {
		t.Fatal("a nil Copies: Forget must be a no-op, Claim and Fetch errors")
	}
}
