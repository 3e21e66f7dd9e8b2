package snapstore_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

func TestCopies(t *testing.T) {
	base := t.TempDir()
	st, err := snapstore.NewLocal(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := snapstore.NewCopies(st, filepath.Join(base, "records"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	img := storetest.MakeImage(t, filepath.Join(base, "sleep", "sb1"), 1<<20)
	want, _, _ := snapstore.DigestOf(img)

	if _, err := c.Digest("sleep/sb1"); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("Digest before a copy = %v, want NotFound", err)
	}
	// OnCopied is told of the copy once its record names it (the
	// cluster writes a sleeping sandbox's record again then).
	told := make(chan string, 4)
	c.OnCopied(func(name string) {
		d, err := c.Digest(name)
		if err != nil || d != want {
			name += fmt.Sprintf(" before its record (%s, %v)", d, err)
		}
		told <- name
	})
	c.Put("sleep/sb1", img)
	if err := c.Wait(t.Context(), "sleep/sb1"); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Digest("sleep/sb1"); err != nil || d != want {
		t.Fatalf("Digest = %s, %v; want %s", d, err, want)
	}
	select {
	case got := <-told:
		if got != "sleep/sb1" {
			t.Fatalf("OnCopied told %q, want sleep/sb1", got)
		}
	default:
		t.Fatal("OnCopied was not told of the copy by the time Wait returned")
	}
	c.OnCopied(func(string) {})
	// Present locally: nothing fetched.
	if got, err := c.Restore(t.Context(), "sleep/sb1", img); got || err != nil {
		t.Fatalf("Restore of a present dir = %v, %v", got, err)
	}
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Restore(t.Context(), "sleep/sb1", img); !got || err != nil {
		t.Fatalf("Restore of a removed dir = %v, %v", got, err)
	}
	if err := stateimg.Verify(img); err != nil {
		t.Fatal(err)
	}
	// No record: nothing to fetch, not an error.
	if got, err := c.Restore(t.Context(), "sleep/other", filepath.Join(base, "sleep", "other")); got || err != nil {
		t.Fatalf("Restore without a copy = %v, %v", got, err)
	}
	if _, err := c.Restore(t.Context(), "sleep/../../x", filepath.Join(base, "x")); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("Restore of a bad name = %v, want InvalidArgument", err)
	}
	// A put of an unsealed dir leaves no record.
	bad := filepath.Join(base, "bad")
	if err := os.MkdirAll(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	c.Put("snapshot/bad", bad)
	if err := c.Wait(t.Context(), "snapshot/bad"); !errors.Is(err, stateimg.ErrCorrupt) {
		t.Fatalf("copy of an unsealed dir = %v, want ErrCorrupt", err)
	}
	if _, err := c.Digest("snapshot/bad"); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("a failed copy left a record: %v", err)
	}
	// Drop removes the record and, once the background work is done,
	// the stored image.
	if err := c.Drop("sleep/sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Digest("sleep/sb1"); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("Digest after Drop = %v", err)
	}
	c.Close()
	if _, err := st.Stat(t.Context(), want); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("stored image after Drop = %v, want NotFound", err)
	}
	var nilCopies *snapstore.Copies
	nilCopies.Put("sleep/x", img)
	if got, err := nilCopies.Restore(t.Context(), "sleep/x", filepath.Join(base, "nope")); got || err != nil || nilCopies.Drop("sleep/x") != nil {
		t.Fatal("a nil Copies is not a no-op")
	}
}
