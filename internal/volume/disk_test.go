package volume

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// TestCloneFileKeepsHoles: a clone has the same bytes, and a copy
// allocates only what the source has allocated.
func TestCloneFileKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := bytes.Repeat([]byte("clade"), 200_000)
	for _, off := range []int64{0, 30 << 20, size - int64(len(data))} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	method, err := cloneFile(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the clone's bytes differ")
	}
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if method == CloneCopy && st.Blocks*512 > 8<<20 {
		t.Fatalf("a copy of a 64 MiB file with 3 MiB of data allocated %d MiB: holes were filled", st.Blocks*512>>20)
	}
	if _, err := cloneFile(src, dst); !os.IsExist(err) {
		t.Fatalf("a clone onto an existing file: %v", err)
	}
}

func TestValidPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/data", true},
		{"/var/lib/postgresql", true},
		{"/root/.cache", true},
		{"/", false},
		{"", false},
		{"data", false},
		{"/data/", false},
		{"/data/../etc", false},
		{"/data//x", false},
		{"/./data", false},
		{"/proc", false},
		{"/proc/sys", false},
		{"/dev/shm", false},
		{"/sys", false},
		{"/.clade", false},
		{"/.clade/run", false},
		{"/etc", false}, // would cover /etc/resolv.conf
		{"/etc/resolv.conf", false},
		{"/a:b", false},
		{"/a,b", false},
		{"/a\x00b", false},
	} {
		err := ValidPath(tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("ValidPath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
		if err != nil && !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("ValidPath(%q): %v is not InvalidArgument", tc.path, err)
		}
	}
}
