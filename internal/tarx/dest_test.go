package tarx

import (
	"archive/tar"
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestExtractToRepeated plays a sandbox that answers two successive copies
// to the same host destination (`clade cp box:/out DST` twice): whatever the
// first archive made at DST, the second must write only there, never into
// the directory a symlink the first one planted points to.
func TestExtractToRepeated(t *testing.T) {
	plant := func(outside string) []entry {
		return []entry{{typ: tar.TypeSymlink, name: "out", link: outside}}
	}
	tests := []struct {
		name          string
		existing      bool   // DST is an existing directory, so the copy lands at DST/out
		dest          string // DST relative to root, "dst" if empty
		first, second func(outside string) []entry
		top           string
		want          map[string]string // root after the second copy: see TestExtractReplaces
		wantErr       func(error) bool  // of the second copy
	}{
		{
			name:  "dir through planted dest",
			first: plant,
			second: func(string) []entry {
				return []entry{{typ: tar.TypeDir, name: "out/", mode: 0o755}, {name: "out/evil", body: "x"}}
			},
			want: map[string]string{"dst": "/", "dst/evil": "x"},
		},
		{
			name:   "file through planted dest",
			first:  plant,
			second: func(string) []entry { return []entry{{name: "out", body: "x"}} },
			want:   map[string]string{"dst": "x"},
		},
		{
			name:  "overwrite through planted dest",
			first: plant,
			second: func(string) []entry {
				return []entry{{typ: tar.TypeDir, name: "out/", mode: 0o755}, {name: "out/secret", body: "x"}}
			},
			want: map[string]string{"dst": "/", "dst/secret": "x"},
		},
		{
			name:  "hardlink through planted dest",
			first: plant,
			second: func(string) []entry {
				return []entry{{typ: tar.TypeDir, name: "out/", mode: 0o755}, {typ: tar.TypeLink, name: "out/h", link: "out/secret"}}
			},
			want:    map[string]string{"dst": "/"},
			wantErr: errdefs.IsInvalidArgument,
		},
		{
			name:   "symlink over planted dest",
			first:  plant,
			second: func(string) []entry { return []entry{{typ: tar.TypeSymlink, name: "out", link: "/elsewhere"}} },
			want:   map[string]string{"dst": "->/elsewhere"},
		},
		{
			// The planted link is inside DST: later entries replace it
			// or are refused, never written through.
			name:     "through planted child",
			existing: true,
			first:    plant,
			second:   func(string) []entry { return []entry{{name: "out/evil", body: "x"}} },
			top:      "out",
			want:     map[string]string{"dst": "/", "dst/out": "->outside"},
			wantErr:  errdefs.IsInvalidArgument,
		},
		{
			// A trailing slash asks for an existing directory: it never
			// makes DST, so it never follows a DST the first copy made.
			name:    "trailing slash",
			dest:    "dst/",
			first:   plant,
			second:  func(string) []entry { return []entry{{typ: tar.TypeDir, name: "out/"}, {name: "out/evil", body: "x"}} },
			want:    map[string]string{},
			wantErr: errdefs.IsNotFound,
		},
		{
			// Into an existing directory, only SRC's base name: a copy of
			// box:/out into ~ cannot make ~/.bashrc.
			name:     "outside top",
			existing: true,
			first:    func(string) []entry { return []entry{{typ: tar.TypeDir, name: "out/"}} },
			second:   func(string) []entry { return []entry{{name: ".bashrc", body: "x"}} },
			top:      "out",
			want:     map[string]string{"dst": "/", "dst/out": "/"},
			wantErr:  errdefs.IsInvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base, root, outside := sandbox(t)
			dest := tc.dest
			if dest == "" {
				dest = "dst"
			}
			if tc.existing {
				if err := os.Mkdir(filepath.Join(root, "dst"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			want := tree(t, outside)
			opts := Options{Top: tc.top}
			err := ExtractTo(root+"/"+dest, bytes.NewReader(archive(t, tc.first(outside)...)), opts)
			if err != nil && tc.dest == "" {
				t.Fatalf("first copy: %v", err)
			}
			err = ExtractTo(root+"/"+dest, bytes.NewReader(archive(t, tc.second(outside)...)), opts)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("second copy: %v", err)
			case tc.wantErr != nil && !tc.wantErr(err):
				t.Errorf("second copy: %v (class %s), want an error of another class", err, errdefs.ClassOf(err))
			}
			untouched(t, base, want)
			got := map[string]string{}
			for p, n := range tree(t, root) {
				switch {
				case p == ".":
				case n.mode.IsDir():
					got[p] = "/"
				case n.mode&os.ModeSymlink != 0 && n.data == outside:
					got[p] = "->outside"
				case n.mode&os.ModeSymlink != 0:
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

// TestExtractToFollows checks the two ways a symlink destination is still
// followed: a trailing slash (the user asks for the directory it names)
// and FollowDest (the agent, inside a sandbox).
func TestExtractToFollows(t *testing.T) {
	for _, tc := range []struct {
		name string
		dest string
		opts Options
	}{
		{"trailing slash", "link/", Options{}},
		{"FollowDest", "link", Options{FollowDest: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.Mkdir(filepath.Join(root, "real"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("real", filepath.Join(root, "link")); err != nil {
				t.Fatal(err)
			}
			a := archive(t, entry{name: "f", body: "x"})
			if err := ExtractTo(root+"/"+tc.dest, bytes.NewReader(a), tc.opts); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(root, "real", "f")); err != nil || string(b) != "x" {
				t.Fatalf("real/f = %q, %v; want the copy inside the linked directory", b, err)
			}
			if fi, err := os.Lstat(filepath.Join(root, "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("link replaced: %v %v", fi, err)
			}
		})
	}
}

// FuzzExtractToTwice extracts an archive to the same destination twice, as
// a repeated `clade cp box:/out DST` does, and checks nothing outside is
// touched.
func FuzzExtractToTwice(f *testing.F) {
	for _, seed := range [][]entry{
		{{typ: tar.TypeSymlink, name: "out", link: "../outside"}, {name: "out/x", body: "x"}},
		{{typ: tar.TypeSymlink, name: "out", link: "../outside"}, {typ: tar.TypeLink, name: "out/h", link: "out/secret"}},
		{{typ: tar.TypeDir, name: "out/"}, {typ: tar.TypeSymlink, name: "out/l", link: "../../outside"}, {name: "out/l/x", body: "x"}},
	} {
		f.Add(bytes.TrimSuffix(archive(f, seed...), make([]byte, 1024)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base, root, outside := sandbox(t)
		t.Cleanup(func() { unlock(base) })
		want := tree(t, outside)
		for range 2 {
			_ = ExtractTo(filepath.Join(root, "dst"), bytes.NewReader(data), Options{})
		}
		untouched(t, base, want)
	})
}
