package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// ent is one tar entry of a test layer. typ defaults to a regular file, or
// a directory when name ends in "/".
type ent struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	size             int64 // header size without a body, if set
	pax              map[string]string
}

func (e ent) header() *tar.Header {
	h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
		Size: int64(len(e.body)), ModTime: time.Unix(1_600_000_000, 0), PAXRecords: e.pax, Format: tar.FormatPAX}
	if h.Typeflag == 0 {
		h.Typeflag = tar.TypeReg
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		}
	}
	if h.Typeflag != tar.TypeReg {
		h.Size = 0
	}
	if h.Mode == 0 {
		h.Mode = 0o644
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
	}
	if e.size != 0 {
		h.Size = e.size
	}
	return h
}

// layerTar builds an uncompressed layer. An entry with size set gets its
// header only, which is where the stream ends.
func layerTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		if err := tw.WriteHeader(e.header()); err != nil {
			t.Fatalf("%s: %v", e.name, err)
		}
		if e.size != 0 {
			tw.Flush()
			return buf.Bytes()
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withTypeflag rewrites the type of the first header in b (a ustar or the
// PAX header's file header) to typ, fixing the checksum: tar.Writer refuses
// to write the types a hostile layer has.
func withTypeflag(b []byte, typ byte) []byte {
	b = slices.Clone(b)
	h := b[:512]
	if h[156] == tar.TypeXHeader {
		n, _ := strconv.ParseInt(strings.Trim(string(b[124:136]), " \x00"), 8, 64)
		h = b[512+(n+511)/512*512:][:512]
	}
	h[156] = typ
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// sandbox returns root, a directory for ApplyLayer, inside a parent holding
// a file outside root that hostile layers would like to reach, and a check
// that nothing but root's contents changed.
func sandbox(t testing.TB) (root string, outside func(t testing.TB)) {
	t.Helper()
	parent := t.TempDir()
	root = filepath.Join(parent, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(parent, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, func(t testing.TB) {
		t.Helper()
		ents, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"root", "victim"}) {
			t.Fatalf("outside root: %v", names)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(victim, &st); err != nil || st.Nlink != 1 || st.Size != 4 || st.Mode&0o7777 != 0o600 {
			t.Fatalf("victim changed: %+v, %v", st, err)
		}
		if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
			t.Fatalf("root replaced: %v", err)
		}
	}
}

func apply(t testing.TB, root string, ents ...ent) {
	t.Helper()
	if err := ApplyLayer(root, bytes.NewReader(layerTar(t, ents...))); err != nil {
		t.Fatal(err)
	}
}

// tree lists root as "path type" lines (f, d, l->target), sorted.
func tree(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, rel+" l->"+l)
		case d.IsDir():
			out = append(out, rel+" d")
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+" f="+string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown, set-id bits); make test runs as root")
	}
}

func TestApplyLayerWhiteouts(t *testing.T) {
	root, outside := sandbox(t)
	apply(t, root,
		ent{name: "etc/"}, ent{name: "etc/a", body: "a"}, ent{name: "etc/b", body: "b"},
		ent{name: "opt/d/"}, ent{name: "opt/d/x", body: "x"}, ent{name: "opt/d/sub/"}, ent{name: "opt/d/sub/y", body: "y"},
		ent{name: "usr/bin/"}, ent{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		ent{name: "keep/"}, ent{name: "keep/old", body: "old"},
	)
	apply(t, root,
		ent{name: "etc/.wh.a"},
		// Entries of the same layer survive its whiteouts, in any order.
		ent{name: "opt/d/z", body: "z"},
		ent{name: "opt/d/.wh..wh..opq"},
		ent{name: "opt/d/late", body: "late"},
		ent{name: "etc/c", body: "c"}, ent{name: "etc/.wh.c"},
		// Through the symlinked parent, as usrmerge images do.
		ent{name: "bin/tool", body: "tool"},
		ent{name: "keep/new", body: "new"}, // no opaque: merges
		ent{name: ".wh..wh.plnk"},          // aufs bookkeeping: ignored
		ent{name: "nothere/.wh.x"},         // nothing to hide
	)
	want := []string{
		"bin l->usr/bin",
		"etc d", "etc/b f=b", "etc/c f=c",
		"keep d", "keep/new f=new", "keep/old f=old",
		"opt d", "opt/d d", "opt/d/late f=late", "opt/d/z f=z",
		"usr d", "usr/bin d", "usr/bin/tool f=tool",
	}
	if got := tree(t, root); !slices.Equal(got, want) {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A whiteout of a directory removes it whole; a file then replaces it.
	apply(t, root, ent{name: ".wh.opt"}, ent{name: "keep", body: "file now"})
	if got := tree(t, root); slices.Contains(got, "opt d") || !slices.Contains(got, "keep f=file now") {
		t.Fatalf("tree: %v", got)
	}
	outside(t)
}

func TestApplyLayerMetadata(t *testing.T) {
	requireRoot(t)
	root, outside := sandbox(t)
	mtime := time.Unix(1_600_000_000, 0)
	apply(t, root,
		ent{name: "usr/bin/"},
		ent{name: "usr/bin/su", body: "su", mode: 0o4755},
		ent{name: "usr/bin/wall", body: "wall", mode: 0o2755, gid: 5},
		ent{name: "tmp/", mode: 0o1777},
		ent{name: "home/u/", mode: 0o700, uid: 1000, gid: 1000},
		ent{name: "home/u/f", body: "data", mode: 0o640, uid: 1000, gid: 1000,
			pax: map[string]string{"SCHILY.xattr.user.clade": "v"}},
		ent{name: "home/u/hard", typ: tar.TypeLink, link: "home/u/f"},
		ent{name: "home/u/shadow", typ: tar.TypeSymlink, link: "/etc/shadow", uid: 1000, gid: 1000},
	)
	check := func(p string, mode fs.FileMode, uid, gid uint32) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != mode || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %v uid %d gid %d, want %v %d %d", p, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
	check("usr/bin/su", 0o755|fs.ModeSetuid, 0, 0)
	check("usr/bin/wall", 0o755|fs.ModeSetgid, 0, 5)
	check("tmp", 0o777|fs.ModeDir|fs.ModeSticky, 0, 0)
	check("home/u", 0o700|fs.ModeDir, 1000, 1000)
	check("home/u/f", 0o640, 1000, 1000)
	check("home/u/shadow", 0o777|fs.ModeSymlink, 1000, 1000)

	var a, b syscall.Stat_t
	_ = syscall.Stat(filepath.Join(root, "home/u/f"), &a)
	_ = syscall.Stat(filepath.Join(root, "home/u/hard"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hardlink: inodes %d %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if l, _ := os.Readlink(filepath.Join(root, "home/u/shadow")); l != "/etc/shadow" {
		t.Errorf("symlink target %q", l)
	}
	buf := make([]byte, 16)
	n, err := unix.Getxattr(filepath.Join(root, "home/u/f"), "user.clade", buf)
	switch {
	case errors.Is(err, unix.ENOTSUP):
		t.Log("filesystem has no user xattrs: not checked")
	case err != nil || string(buf[:n]) != "v":
		t.Errorf("xattr: %q, %v", buf[:n], err)
	}
	// A later layer's file replaces the symlink instead of writing to
	// /etc/shadow (here: root/etc/shadow, absent).
	apply(t, root, ent{name: "home/u/shadow", body: "mine"})
	if got := tree(t, root); !slices.Contains(got, "home/u/shadow f=mine") || slices.Contains(got, "etc d") {
		t.Fatalf("tree: %v", got)
	}
	outside(t)
}

func TestApplyLayerAbsoluteSymlinkStaysInside(t *testing.T) {
	root, outside := sandbox(t)
	parent := filepath.Dir(root)
	// Both point at the parent's "victim" if followed on the host.
	apply(t, root,
		ent{name: "abs", typ: tar.TypeSymlink, link: parent},
		ent{name: "abs/victim", body: "inside"},
		ent{name: "/etc/passwd", body: "root:x:0:0"}, // leading "/" is the image root
	)
	if b, err := os.ReadFile(filepath.Join(root, parent, "victim")); err != nil || string(b) != "inside" {
		t.Fatalf("write through absolute symlink: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	outside(t)
}

func TestApplyLayerHostile(t *testing.T) {
	big := int64(MaxEntrySize + 1)
	cases := []struct {
		name  string
		layer func(t testing.TB, root string) []byte
	}{
		{"dotdot", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "../victim", body: "x"}) }},
		{"dotdot inside", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "a/../../victim", body: "x"}) }},
		{"absolute dotdot", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "/../victim", body: "x"}) }},
		{"symlink out then through", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "l", typ: tar.TypeSymlink, link: "../"}, ent{name: "l/victim", body: "x"})
		}},
		{"nested symlink out", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "a/"}, ent{name: "a/b", typ: tar.TypeSymlink, link: "../.."}, ent{name: "a/b/victim", body: "x"})
		}},
		{"symlink out then dir", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "l", typ: tar.TypeSymlink, link: "../../../.."}, ent{name: "l/new/"})
		}},
		{"whiteout through symlink", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "l", typ: tar.TypeSymlink, link: ".."}, ent{name: "l/.wh.victim"})
		}},
		{"opaque through symlink", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "l", typ: tar.TypeSymlink, link: ".."}, ent{name: "l/.wh..wh..opq"})
		}},
		{"whiteout of dot", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "a/"}, ent{name: "a/.wh."}) }},
		{"whiteout of dotdot", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: ".wh..."}) }},
		{"hardlink out", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "h", typ: tar.TypeLink, link: "../victim"})
		}},
		{"hardlink through symlink out", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "l", typ: tar.TypeSymlink, link: ".."}, ent{name: "h", typ: tar.TypeLink, link: "l/victim"})
		}},
		{"hardlink absolute host path", func(t testing.TB, root string) []byte {
			return layerTar(t, ent{name: "h", typ: tar.TypeLink, link: filepath.Join(filepath.Dir(root), "victim")})
		}},
		{"hardlink to dir", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "d/"}, ent{name: "h", typ: tar.TypeLink, link: "d"})
		}},
		{"symlink loop", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "a", typ: tar.TypeSymlink, link: "b"}, ent{name: "b", typ: tar.TypeSymlink, link: "a"}, ent{name: "a/x", body: "x"})
		}},
		{"file as parent", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "f", body: "f"}, ent{name: "f/x", body: "x"})
		}},
		{"char device", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666})
		}},
		{"block device", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660})
		}},
		{"fifo", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "fifo", typ: tar.TypeFifo}) }},
		{"oversize", func(t testing.TB, _ string) []byte { return layerTar(t, ent{name: "big", size: big}) }},
		{"gnu sparse", func(t testing.TB, _ string) []byte {
			return withTypeflag(layerTar(t, ent{name: "sparse", body: "x"}), tar.TypeGNUSparse)
		}},
		{"pax sparse", func(t testing.TB, _ string) []byte {
			// tar.Writer drops GNU.sparse records: write look-alikes, then patch them.
			b := layerTar(t, ent{name: "sparse", body: "1\n0\n1\n" + strings.Repeat("\x00", 506) + "x",
				pax: map[string]string{"GNU.sparxx.major": "1", "GNU.sparxx.minor": "0", "GNU.sparxx.name": "sparse", "GNU.sparxx.realsize": "1"}})
			return bytes.ReplaceAll(b, []byte("GNU.sparxx"), []byte("GNU.sparse"))
		}},
		{"unknown type", func(t testing.TB, _ string) []byte {
			return withTypeflag(layerTar(t, ent{name: "x", body: "x"}), 'Z')
		}},
		{"long name", func(t testing.TB, _ string) []byte {
			return layerTar(t, ent{name: strings.Repeat("a/", 2100) + "x", body: "x"})
		}},
		{"truncated", func(t testing.TB, _ string) []byte {
			b := layerTar(t, ent{name: "x", body: strings.Repeat("x", 2000)})
			return b[:1000]
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, outside := sandbox(t)
			err := ApplyLayer(root, bytes.NewReader(c.layer(t, root)))
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v (class %s), want an InvalidArgument error", err, errdefs.ClassOf(err))
			}
			t.Log(err)
			outside(t)
		})
	}
}

// FuzzApplyLayer feeds arbitrary bytes, and mutations of layers that try to
// escape, to ApplyLayer: whatever it makes of them, nothing may appear or
// change outside root.
func FuzzApplyLayer(f *testing.F) {
	seeds := [][]ent{
		{{name: "a/"}, {name: "a/b", body: "b"}, {name: "a/.wh.b"}, {name: "a/.wh..wh..opq"}},
		{{name: "l", typ: tar.TypeSymlink, link: "../"}, {name: "l/victim", body: "x"}},
		{{name: "l", typ: tar.TypeSymlink, link: "/"}, {name: "l/x", body: "x"}},
		{{name: "h", typ: tar.TypeLink, link: "../victim"}},
		{{name: "../victim", body: "x"}},
		{{name: "f", body: "f"}, {name: "g", typ: tar.TypeLink, link: "f"}, {name: ".wh.f"}},
		{{name: "d/", mode: 0o4777}, {name: "d/x", body: "x", pax: map[string]string{"SCHILY.xattr.user.a": "b"}}},
	}
	for _, s := range seeds {
		f.Add(layerTar(f, s...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		root, outside := sandbox(t)
		_ = ApplyLayer(root, bytes.NewReader(b))
		outside(t)
	})
}
