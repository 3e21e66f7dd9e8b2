package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// shipSource makes a root to send: files, a symlink, an empty directory,
// an executable.
func shipSource(t *testing.T) Image {
	t.Helper()
	src := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"etc", "bin", "var/empty"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "etc/os-release"), []byte("NAME=shiptest\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "bin/tool"), bytes.Repeat([]byte("x"), 3<<20), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/os-release", filepath.Join(src, "etc/link")); err != nil {
		t.Fatal(err)
	}
	return Image{Name: "shipped", Source: "test", RootFS: src, Config: Config{Env: []string{"A=1"}}}
}

// frame builds a root stream around tarBytes by hand (a hostile sender's).
func frame(desc Image, tarBytes []byte, sum []byte) []byte {
	var out bytes.Buffer
	d, _ := json.Marshal(desc)
	_ = binary.Write(&out, binary.BigEndian, uint32(len(d)))
	out.Write(d)
	for p := tarBytes; len(p) > 0; {
		k := min(len(p), maxFrame)
		_ = binary.Write(&out, binary.BigEndian, uint32(k))
		out.Write(p[:k])
		p = p[k:]
	}
	_ = binary.Write(&out, binary.BigEndian, uint32(0))
	if sum == nil {
		s := sha256.Sum256(tarBytes)
		sum = s[:]
	}
	out.Write(sum)
	return out.Bytes()
}

// TestRootStream: a root sent by SendRoot arrives whole over real HTTP and
// is installed as a new root; a byte flipped, a cut, bytes after, a tree
// over the limit, an escaping entry, a device, a descriptor the caller
// refuses and a huge descriptor length are each refused with a clear error
// and leave nothing in the image directory.
func TestRootStream(t *testing.T) {
	src := shipSource(t)
	from := newTestStore(t)
	var sent bytes.Buffer
	if err := from.SendRoot(t.Context(), &sent, src); err != nil {
		t.Fatal(err)
	}
	intact := sent.Bytes()
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	to := newTestStore(t)
	var announced []string
	to.OnRoot = func(rootfs string) error { announced = append(announced, rootfs); return nil }
	receive := func(b []byte, opts ReceiveOptions) (Image, error) {
		body = b
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return to.ReceiveRoot(t.Context(), resp.Body, opts)
	}
	limits := ReceiveOptions{MaxBytes: 64 << 20, MaxEntries: 1000}

	img, err := receive(intact, limits)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "shipped" || img.Config.Env[0] != "A=1" || len(announced) != 1 || announced[0] != img.RootFS {
		t.Fatalf("received %+v, announced %v", img, announced)
	}
	if b, err := os.ReadFile(filepath.Join(img.RootFS, "etc/os-release")); err != nil || string(b) != "NAME=shiptest\n" {
		t.Fatalf("os-release: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(img.RootFS, "etc/link")); err != nil || l != "/etc/os-release" {
		t.Fatalf("link: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(img.RootFS, "bin/tool")); err != nil || fi.Size() != 3<<20 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("bin/tool: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(img.RootFS, "var/empty")); err != nil || !fi.IsDir() {
		t.Fatalf("var/empty: %v", err)
	}
	if got := DirSize(img.RootFS); got != DirSize(src.RootFS) {
		t.Fatalf("size %d, the source's %d", got, DirSize(src.RootFS))
	}
	if a, b := img, src; a.Name != b.Name || a.Source != b.Source || !a.CreatedAt.Equal(b.CreatedAt) || a.SizeBytes != b.SizeBytes {
		t.Fatalf("descriptor %+v, sent %+v", a, b)
	}
	before := entries(t, to.Dir())

	descLen := int(binary.BigEndian.Uint32(intact))
	treeStart := 4 + descLen + 4 // the first frame's bytes
	flipped := bytes.Clone(intact)
	flipped[treeStart+600] ^= 0x40 // in the first header's or file's bytes
	flippedLate := bytes.Clone(intact)
	flippedLate[bytes.Index(flippedLate, bytes.Repeat([]byte("x"), 4096))+1000] ^= 0x01 // a file's content: only the digest tells
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	var dev bytes.Buffer
	tw = tar.NewWriter(&dev)
	_ = tw.WriteHeader(&tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o600, Devmajor: 8})
	_ = tw.Close()
	var many bytes.Buffer
	tw = tar.NewWriter(&many)
	for i := range 20 {
		_ = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%d", i), Typeflag: tar.TypeReg, Mode: 0o644})
	}
	_ = tw.Close()
	huge := bytes.Clone(intact)
	binary.BigEndian.PutUint32(huge, 1<<31)
	desc := Image{Name: "shipped", Source: "test"}
	for _, c := range []struct {
		name string
		body []byte
		opts ReceiveOptions
		want string
	}{
		{"byte flipped", flipped, limits, "bad image root stream"},
		{"content flipped", flippedLate, limits, "SHA-256"},
		{"cut", intact[:len(intact)/2], limits, "cut"},
		{"no digest", intact[:len(intact)-10], limits, "digest"},
		{"bytes after", append(bytes.Clone(intact), 0), limits, "after its end"},
		{"over the size limit", intact, ReceiveOptions{MaxBytes: 1 << 20}, "over the limit of 1048576 bytes"},
		{"too many entries", frame(desc, many.Bytes(), nil), ReceiveOptions{MaxEntries: 10}, "more than 10 entries"},
		{"escaping entry", frame(desc, evil.Bytes(), nil), limits, "escape"},
		{"device", frame(desc, dev.Bytes(), nil), limits, "device"},
		{"huge descriptor", huge, limits, "descriptor of 2147483648 bytes"},
		{"bad name", frame(Image{Name: "../x"}, many.Bytes(), nil), limits, "no valid image"},
		{"refused by the caller", intact, ReceiveOptions{Check: func(Image) error {
			return errdefs.New(errdefs.Conflict, "not the root asked for")
		}}, "not the root asked for"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := len(announced)
			_, err := receive(c.body, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if c.name != "refused by the caller" && (!errors.Is(err, ErrRootStream) || !errdefs.IsInvalidArgument(err)) {
				t.Fatalf("%v is not an InvalidArgument ErrRootStream", err)
			}
			if len(announced) != n {
				t.Fatalf("a refused stream announced a root: %v", announced[n:])
			}
			if got := entries(t, to.Dir()); !equalSets(got, before) {
				t.Fatalf("a refused stream left %v (before: %v)", got, before)
			}
		})
	}
}

// entries lists everything under dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, strings.TrimPrefix(p, dir))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func equalSets(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}

var _ io.Reader = (*frameReader)(nil)
