package image

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestRootStreamTarTricks: trees that try to write outside the root
// (through a symlink they made, a hardlink out, an absolute path, ..) or
// to cost more than they say (a huge sparse size) are refused or kept
// inside the build; nothing outside the image directory changes.
func TestRootStreamTarTricks(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	type ent struct {
		h    tar.Header
		body string
	}
	build := func(es ...ent) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range es {
			h := e.h
			if h.Typeflag == tar.TypeReg {
				h.Size = int64(len(e.body))
			}
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if e.body != "" {
				_, _ = tw.Write([]byte(e.body))
			}
		}
		_ = tw.Close()
		return b.Bytes()
	}
	desc := Image{Name: "tricks", Source: "test"}
	cases := map[string][]byte{
		"symlink then file through it": build(
			ent{h: tar.Header{Name: "d", Typeflag: tar.TypeSymlink, Linkname: outside}},
			ent{h: tar.Header{Name: "d/victim", Typeflag: tar.TypeReg}, body: "evil"}),
		"relative symlink then file": build(
			ent{h: tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../../" + outside}},
			ent{h: tar.Header{Name: "up/victim", Typeflag: tar.TypeReg}, body: "evil"}),
		"hardlink out": build(
			ent{h: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: victim}}),
		"hardlink via symlink": build(
			ent{h: tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: victim}},
			ent{h: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "s"}},
			ent{h: tar.Header{Name: "h", Typeflag: tar.TypeReg}, body: "evil"}),
		"absolute path": build(ent{h: tar.Header{Name: victim, Typeflag: tar.TypeReg}, body: "evil"}),
		"dotdot":        build(ent{h: tar.Header{Name: "a/../../../../../../" + victim, Typeflag: tar.TypeReg}, body: "evil"}),
		"symlink replaced by file then through": build(
			ent{h: tar.Header{Name: "x", Typeflag: tar.TypeDir, Mode: 0o755}},
			ent{h: tar.Header{Name: "x", Typeflag: tar.TypeSymlink, Linkname: outside}},
			ent{h: tar.Header{Name: "x/victim", Typeflag: tar.TypeReg}, body: "evil"}),
	}
	for name, tb := range cases {
		t.Run(name, func(t *testing.T) {
			to := newTestStore(t)
			img, err := to.ReceiveRoot(t.Context(), bytes.NewReader(frame(desc, tb, nil)), ReceiveOptions{MaxBytes: 1 << 30, MaxEntries: 100})
			if b, _ := os.ReadFile(victim); string(b) != "mine" {
				t.Fatalf("the file outside was written: %q", b)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Fatalf("outside has %d entries", len(ents))
			}
			t.Logf("err %v, root %s", err, img.RootFS)
		})
	}
}
