package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestFileMarkers: markers are found wherever the file's data holds them:
// after a large hole, in a second data region, across a chunk's boundary,
// at the very end; never one the file does not hold.
func TestFileMarkers(t *testing.T) {
	dir := t.TempDir()
	a, b, c, d, none := "marker-aaaaaaaaaaaa", "marker-bbbbbbbbbbbb", "marker-cccccccccccc", "marker-dddddddddddd", "marker-nnnnnnnnnnnn"
	markers := []string{a, b, c, d, none}
	p := filepath.Join(dir, "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	write := func(off int64, s []byte) {
		if _, err := f.WriteAt(s, off); err != nil {
			t.Fatal(err)
		}
	}
	write(64<<20, []byte(a)) // after a 64 MiB hole
	// Across the boundary of the first chunk read of a region.
	region := int64(256 << 20)
	fill := bytes.Repeat([]byte("x"), scanChunk+4096)
	write(region, fill)
	write(region+scanChunk-5, []byte(b))
	write(512<<20, []byte(c)) // a third region
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	write(1<<30, []byte(d)) // the last bytes
	f.Close()
	got := fileMarkers(p, markers)
	if want := []string{a, b, c, d}; !slices.Equal(got, want) {
		t.Fatalf("fileMarkers = %q, want %q", got, want)
	}
	// The scan reads data, not holes: a 1 GiB file of a few blocks.
	var st os.FileInfo
	if st, err = os.Stat(p); err != nil || st.Size() < 1<<30 {
		t.Fatalf("the file: %v %v", st, err)
	}
	if got := fileMarkers(filepath.Join(dir, "missing"), markers); got != nil {
		t.Fatalf("a missing file: %q", got)
	}
	if got := FindMarkers(dir, "", markers); len(got) != 4 || len(got[b]) != 1 || got[b][0] != p {
		t.Fatalf("FindMarkers = %v", got)
	}
}
