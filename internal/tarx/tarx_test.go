package tarx

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

var epoch = time.Unix(1_600_000_000, 0)

// node is what a copy must preserve about one file.
type node struct {
	mode  fs.FileMode
	data  string // content, or a symlink's target
	mtime int64
}

// tree describes the file tree at root (not following root if it is a
// symlink), keyed by slash path relative to root.
func tree(t *testing.T, root string) map[string]node {
	t.Helper()
	m := map[string]node{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n := node{mode: fi.Mode(), mtime: fi.ModTime().Unix()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			n.data, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			n.data = string(b)
		}
		rel, _ := filepath.Rel(root, p)
		m[filepath.ToSlash(rel)] = n
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameTree(t *testing.T, want, got map[string]node) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok {
			t.Errorf("%s: missing", k)
		} else if g != want[k] {
			t.Errorf("%s: got %v %q mtime %d, want %v %q mtime %d", k, g.mode, g.data, g.mtime, want[k].mode, want[k].data, want[k].mtime)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected", k)
		}
	}
}

// sourceTree builds "data", holding every kind of entry Create stores, in a
// temporary directory it returns.
func sourceTree(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	bin := make([]byte, 3000)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{
		{"data", 0o755},
		{"data/sub", 0o750},
		{"data/sub/deep", 0o700},
		{"data/empty-dir", 0o711},
	} {
		p := filepath.Join(base, d.name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		name string
		mode fs.FileMode
		data string
	}{
		{"data/a.txt", 0o644, "hello\n"},
		{"data/run.sh", 0o755, "#!/bin/sh\necho hi\n"},
		{"data/empty", 0o600, ""},
		{"data/sub/bin.dat", 0o640, string(bin)},
		{"data/sub/deep/ro", 0o444, "read only"},
	} {
		p := filepath.Join(base, f.name)
		if err := os.WriteFile(p, []byte(f.data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{
		"data/link":     "sub/deep/ro",
		"data/dangling": "/nonexistent/target",
	} {
		if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Deepest first, so setting a child's times leaves its parent's alone.
	paths := slices.Collect(maps.Keys(tree(t, filepath.Join(base, "data"))))
	slices.SortFunc(paths, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for i, p := range paths {
		ts := unix.NsecToTimespec(epoch.Add(time.Duration(i) * time.Hour).UnixNano())
		err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(base, "data", p), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			t.Fatal(err)
		}
	}
	return base
}

func TestRoundTrip(t *testing.T) {
	src := sourceTree(t)
	tests := []struct {
		name string
		src  string // relative to the source's base
		dest string // relative to a fresh output directory
		got  string // where the copy lands, relative to the output directory
	}{
		{"dir into existing dir", "data", ".", "data"},
		{"dir to new name", "data", "copy", "copy"},
		{"dir to same name", "data", "data", "data"},
		{"nested dir to new name", "data/sub", "s", "s"},
		{"file into existing dir", "data/a.txt", ".", "a.txt"},
		{"file to new name", "data/sub/bin.dat", "b.dat", "b.dat"},
		{"empty file", "data/empty", "e", "e"},
		{"symlink stays a link", "data/link", "l", "l"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from := filepath.Join(src, tc.src)
			var buf bytes.Buffer
			if err := Create(&buf, from, filepath.Base(from)); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			if err := ExtractTo(filepath.Join(out, tc.dest), &buf, Options{}); err != nil {
				t.Fatal(err)
			}
			sameTree(t, tree(t, from), tree(t, filepath.Join(out, tc.got)))
		})
	}
}

// entry is one header (and body) of a hand-made archive.
type entry struct {
	typ  byte // tar.TypeReg if zero
	name string
	link string
	body string
	mode int64 // 0o644 if zero
	uid  int   // also the gid
	size int64 // header size if not len(body); the archive stops after it
	pax  map[string]string
}

func archive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			Size: int64(len(e.body)), ModTime: epoch, Format: tar.FormatPAX,
			PAXRecords: map[string]string{},
		}
		for k, v := range e.pax {
			// The writer refuses to emit GNU.sparse records: smuggle
			// them past it under a name of the same length.
			hdr.PAXRecords[strings.Replace(k, "GNU.sparse.", "XXX.sparse.", 1)] = v
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if e.size != 0 {
			hdr.Size = e.size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.size != 0 {
			// The writer has already emitted the header; the body would
			// be too big to write, and Extract must refuse before it.
			return unsmuggle(buf.Bytes())
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return unsmuggle(buf.Bytes())
}

func unsmuggle(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("XXX.sparse."), []byte("GNU.sparse."))
}

// sandbox makes base/root to extract into and base/outside holding "secret",
// which extraction must never touch.
func sandbox(t *testing.T) (base, root, outside string) {
	t.Helper()
	base = t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	return base, root, outside
}

// untouched fails t if anything but root and outside appeared in base, or if
// outside changed since want was taken.
func untouched(t *testing.T, base string, want map[string]node) {
	t.Helper()
	ents, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "root" && e.Name() != "outside" {
			t.Errorf("%s appeared outside root", e.Name())
		}
	}
	sameTree(t, want, tree(t, filepath.Join(base, "outside")))
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(base, "outside", "secret"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Nlink != 1 {
		t.Errorf("outside/secret has %d links, want 1", st.Nlink)
	}
}

func TestExtractRefusesHostile(t *testing.T) {
	long := strings.Repeat("d/", maxNameLen/2) + "f"
	tests := []struct {
		name    string
		setup   func(t *testing.T, root, outside string)
		entries func(outside string) []entry
	}{
		{name: "dotdot", entries: func(string) []entry {
			return []entry{{name: "../outside/x", body: "x"}}
		}},
		{name: "dotdot after dir", entries: func(string) []entry {
			return []entry{{name: "a/../../outside/x", body: "x"}}
		}},
		{name: "absolute", entries: func(outside string) []entry {
			return []entry{{name: outside + "/x", body: "x"}}
		}},
		{name: "file through symlink out", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: outside}, {name: "l/x", body: "x"}}
		}},
		{name: "file through symlink to dotdot", entries: func(string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: ".."}, {name: "l/outside/x", body: "x"}}
		}},
		{name: "file through symlink inside root", entries: func(string) []entry {
			return []entry{{typ: tar.TypeDir, name: "d/"}, {typ: tar.TypeSymlink, name: "l", link: "d"}, {name: "l/x", body: "x"}}
		}},
		{name: "dir through symlink", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: outside}, {typ: tar.TypeDir, name: "l/d/"}}
		}},
		{name: "symlink through symlink", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: outside}, {typ: tar.TypeSymlink, name: "l/s", link: "/"}}
		}},
		{
			name: "file through existing symlink",
			setup: func(t *testing.T, root, outside string) {
				if err := os.Symlink(outside, filepath.Join(root, "l")); err != nil {
					t.Fatal(err)
				}
			},
			entries: func(string) []entry { return []entry{{name: "l/secret", body: "x"}} },
		},
		{name: "hardlink dotdot", entries: func(string) []entry {
			return []entry{{typ: tar.TypeLink, name: "h", link: "../outside/secret"}}
		}},
		{name: "hardlink absolute", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeLink, name: "h", link: outside + "/secret"}}
		}},
		{name: "hardlink through symlink", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: outside}, {typ: tar.TypeLink, name: "h", link: "l/secret"}}
		}},
		// The walker keeps the directory of the last file open for the
		// next one: a directory replaced by a symlink between two of its
		// files must not carry the second one out.
		{name: "file after its dir became a symlink", entries: func(outside string) []entry {
			return []entry{{typ: tar.TypeDir, name: "d/"}, {name: "d/a", body: "a"},
				{typ: tar.TypeSymlink, name: "d", link: outside}, {name: "d/x", body: "x"}}
		}},
		{name: "file after its parent became a symlink", entries: func(outside string) []entry {
			return []entry{{name: "p/d/a", body: "a"},
				{typ: tar.TypeSymlink, name: "p", link: outside}, {name: "p/d/x", body: "x"}}
		}},
		{name: "char device", entries: func(string) []entry {
			return []entry{{typ: tar.TypeChar, name: "null"}}
		}},
		{name: "block device", entries: func(string) []entry {
			return []entry{{typ: tar.TypeBlock, name: "sda"}}
		}},
		{name: "fifo", entries: func(string) []entry {
			return []entry{{typ: tar.TypeFifo, name: "p"}}
		}},
		{name: "oversize", entries: func(string) []entry {
			return []entry{{name: "big", size: MaxEntrySize + 1}}
		}},
		{name: "sparse", entries: func(string) []entry {
			return []entry{{name: "zeros", pax: map[string]string{
				"GNU.sparse.major": "0", "GNU.sparse.minor": "1",
				"GNU.sparse.numblocks": "0", "GNU.sparse.size": "1073741824",
			}}}
		}},
		{name: "long name", entries: func(string) []entry {
			return []entry{{name: long, body: "x"}}
		}},
		{name: "long symlink target", entries: func(string) []entry {
			return []entry{{typ: tar.TypeSymlink, name: "l", link: long}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base, root, outside := sandbox(t)
			if tc.setup != nil {
				tc.setup(t, root, outside)
			}
			want := tree(t, outside)
			err := Extract(root, bytes.NewReader(archive(t, tc.entries(outside)...)), Options{})
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("Extract = %v, want an InvalidArgument error", err)
			}
			untouched(t, base, want)
		})
	}
}

// TestExtractLimit: Limit sees every entry's number before the entry is
// written, and its error ends the extraction as it is.
func TestExtractLimit(t *testing.T) {
	root := t.TempDir()
	stop := errors.New("limit reached")
	var seen []int
	err := Extract(root, bytes.NewReader(archive(t, entry{typ: tar.TypeDir, name: "d/"}, entry{name: "d/a", body: "a"},
		entry{name: "d/b", body: "b"}, entry{name: "d/c", body: "c"})), Options{Limit: func(n int) error {
		seen = append(seen, n)
		if n > 3 {
			return stop
		}
		return nil
	}})
	if err != stop {
		t.Fatalf("Extract = %v, want the limit's own error", err)
	}
	if fmt.Sprint(seen) != "[1 2 3 4]" {
		t.Fatalf("Limit saw %v, want [1 2 3 4]", seen)
	}
	for name, want := range map[string]bool{"d/a": true, "d/b": true, "d/c": false} {
		if _, err := os.Stat(filepath.Join(root, name)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", name, err == nil, want)
		}
	}
}

func TestExtractReplaces(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, root, outside string)
		entries []entry
		want    map[string]string // path in root: content, "->target" for a symlink, "/" for a directory
	}{
		{
			name: "file over symlink",
			setup: func(t *testing.T, root, outside string) {
				if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "f")); err != nil {
					t.Fatal(err)
				}
			},
			entries: []entry{{name: "f", body: "new"}},
			want:    map[string]string{"f": "new"},
		},
		{
			name: "file over hardlink",
			setup: func(t *testing.T, root, outside string) {
				if err := os.Link(filepath.Join(outside, "secret"), filepath.Join(root, "f")); err != nil {
					t.Fatal(err)
				}
			},
			entries: []entry{{name: "f", body: "new"}},
			want:    map[string]string{"f": "new"},
		},
		{
			name: "dir over dir keeps contents",
			setup: func(t *testing.T, root, _ string) {
				if err := os.MkdirAll(filepath.Join(root, "d", "keep"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			entries: []entry{{typ: tar.TypeDir, name: "d/", mode: 0o755}, {name: "d/new", body: "n"}},
			want:    map[string]string{"d": "/", "d/keep": "/", "d/new": "n"},
		},
		{
			name: "file over dir",
			setup: func(t *testing.T, root, _ string) {
				if err := os.MkdirAll(filepath.Join(root, "d", "sub"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			entries: []entry{{name: "d", body: "file"}},
			want:    map[string]string{"d": "file"},
		},
		{
			name:    "symlink replaced within archive",
			entries: []entry{{typ: tar.TypeSymlink, name: "l", link: "/"}, {typ: tar.TypeDir, name: "l/", mode: 0o755}, {name: "l/f", body: "f"}},
			want:    map[string]string{"l": "/", "l/f": "f"},
		},
		{
			name:    "hardlink and implicit parents",
			entries: []entry{{name: "a/b/f", body: "x"}, {typ: tar.TypeLink, name: "a/h", link: "a/b/f"}, {typ: tar.TypeSymlink, name: "s", link: "../../anywhere"}},
			want:    map[string]string{"a": "/", "a/b": "/", "a/b/f": "x", "a/h": "x", "s": "->../../anywhere"},
		},
		{
			name:    "dot entries",
			entries: []entry{{typ: tar.TypeDir, name: "./", mode: 0o700}, {name: "./x/../y", body: "y"}},
			want:    map[string]string{"y": "y"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base, root, outside := sandbox(t)
			if tc.setup != nil {
				tc.setup(t, root, outside)
			}
			want := tree(t, outside)
			if err := Extract(root, bytes.NewReader(archive(t, tc.entries...)), Options{}); err != nil {
				t.Fatal(err)
			}
			untouched(t, base, want)
			got := map[string]string{}
			for p, n := range tree(t, root) {
				switch {
				case p == ".":
				case n.mode.IsDir():
					got[p] = "/"
				case n.mode&fs.ModeSymlink != 0:
					got[p] = "->" + n.data
				default:
					got[p] = n.data
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("root holds %v, want %v", got, tc.want)
			}
		})
	}
}

func TestExtractModes(t *testing.T) {
	tests := []struct {
		name     string
		root     bool // needs root to chown
		opts     Options
		entries  []entry
		path     string
		wantMode fs.FileMode
		wantUID  int // -1: the caller
	}{
		{
			name:     "setuid and owner dropped without chown",
			entries:  []entry{{name: "f", mode: 0o4755 | 0o2000, uid: 4242}},
			path:     "f",
			wantMode: 0o755,
			wantUID:  -1,
		},
		{
			name:     "setuid kept with chown",
			root:     true,
			opts:     Options{Chown: true},
			entries:  []entry{{name: "f", mode: 0o4755, uid: 4242}},
			path:     "f",
			wantMode: 0o755 | fs.ModeSetuid,
			wantUID:  4242,
		},
		{
			name:     "read-only dir still filled",
			entries:  []entry{{typ: tar.TypeDir, name: "d/", mode: 0o555}, {name: "d/f", body: "f"}},
			path:     "d",
			wantMode: 0o555 | fs.ModeDir,
			wantUID:  -1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			root := t.TempDir()
			t.Cleanup(func() { unlock(root) })
			if err := Extract(root, bytes.NewReader(archive(t, tc.entries...)), tc.opts); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(filepath.Join(root, tc.path))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != tc.wantMode {
				t.Errorf("mode %v, want %v", fi.Mode(), tc.wantMode)
			}
			if !fi.ModTime().Equal(epoch) {
				t.Errorf("mtime %v, want %v", fi.ModTime(), epoch)
			}
			uid := int(fi.Sys().(*syscall.Stat_t).Uid)
			if want := tc.wantUID; want < 0 && uid != os.Geteuid() || want >= 0 && uid != want {
				t.Errorf("uid %d, want %d", uid, want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	one := archive(t, entry{name: "a", body: "a"})
	two := archive(t, entry{name: "a", body: "a"}, entry{name: "b", body: "b"})
	big := archive(t, entry{name: "a", body: strings.Repeat("a", 1000)})
	tests := []struct {
		name string
		run  func() error
		is   func(error) bool
	}{
		{"create missing src", func() error { return Create(&bytes.Buffer{}, filepath.Join(dir, "nope"), "nope") }, errdefs.IsNotFound},
		{"extract missing root", func() error { return Extract(filepath.Join(dir, "nope"), bytes.NewReader(one), Options{}) }, errdefs.IsNotFound},
		{"extractTo missing parent", func() error { return ExtractTo(filepath.Join(dir, "nope", "x"), bytes.NewReader(one), Options{}) }, errdefs.IsNotFound},
		{"extractTo empty dest", func() error { return ExtractTo("", bytes.NewReader(one), Options{}) }, errdefs.IsInvalidArgument},
		{"extractTo two top-level names", func() error { return ExtractTo(filepath.Join(dir, "new"), bytes.NewReader(two), Options{}) }, errdefs.IsInvalidArgument},
		{"extractTo empty archive", func() error { return ExtractTo(filepath.Join(dir, "new"), bytes.NewReader(archive(t)), Options{}) }, errdefs.IsInvalidArgument},
		{"truncated archive", func() error { return Extract(dir, bytes.NewReader(big[:700]), Options{}) }, errdefs.IsInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); !tc.is(err) {
				t.Errorf("got %v (class %s)", err, errdefs.ClassOf(err))
			}
		})
	}
}

func FuzzExtract(f *testing.F) {
	for _, seed := range [][]entry{
		{{typ: tar.TypeDir, name: "d/", mode: 0o755}, {name: "d/f", body: "hello"}, {typ: tar.TypeSymlink, name: "d/l", link: "f"}, {typ: tar.TypeLink, name: "h", link: "d/f"}},
		{{name: "../x", body: "x"}},
		{{name: "/tmp/tarx-fuzz-abs", body: "x"}},
		{{typ: tar.TypeSymlink, name: "l", link: ".."}, {name: "l/x", body: "x"}},
		{{typ: tar.TypeSymlink, name: "l", link: "/tmp"}, {typ: tar.TypeLink, name: "h", link: "l/x"}},
		{{typ: tar.TypeLink, name: "h", link: "../x"}},
		{{typ: tar.TypeFifo, name: "p"}},
		{{name: "big", size: MaxEntrySize + 1}},
		{{name: "sparse", pax: map[string]string{"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.numblocks": "0", "GNU.sparse.size": "4096"}}},
	} {
		// Without the end-of-archive blocks, which the reader does not
		// need: smaller seeds are much faster to minimize.
		b := archive(f, seed...)
		f.Add(bytes.TrimSuffix(b, make([]byte, 1024)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base, root, outside := sandbox(t)
		t.Cleanup(func() { unlock(base) })
		want := tree(t, outside)
		_ = Extract(root, bytes.NewReader(data), Options{})
		untouched(t, base, want)
	})
}

// unlock makes every directory under dir writable so t.TempDir's cleanup can
// remove what a fuzzed archive left read-only, even when not root.
func unlock(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
}
