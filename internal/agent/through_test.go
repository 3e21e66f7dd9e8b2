package agent_test

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// oneFile is a tar archive of one regular file.
func oneFile(name, data string) *bytes.Buffer {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte(data))
	_ = tw.Close()
	return &b
}

// TestCopyInThrough: E2B's writes (guest.CopyInThrough) never replace a
// directory, write through a symlink as envd does, and do so with the
// user's credentials: a link to a file the user may not write leaves it
// untouched. CopyIn keeps docker cp's semantics (it replaces both).
func TestCopyInThrough(t *testing.T) {
	testenv.RequireRoot(t)
	etc := t.TempDir()
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\ntuser:x:4242:4243::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\ntgroup:x:4243:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := userAgent(t, etc)
	dir := worldDir(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chown(dir, 4242, 4243))
	// A directory with a file in it, where an upload names a file.
	must(os.MkdirAll(filepath.Join(dir, "d"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "d", "keep"), []byte("keep"), 0o644))
	// A link to the user's own file, and one to a file of root's.
	must(os.WriteFile(filepath.Join(dir, "real"), []byte("old"), 0o640))
	must(os.Chown(filepath.Join(dir, "real"), 4242, 4243))
	must(os.Symlink("real", filepath.Join(dir, "link")))
	secret := filepath.Join(worldDir(t), "secret")
	must(os.WriteFile(secret, []byte("root's"), 0o644))
	must(os.Symlink(secret, filepath.Join(dir, "evil")))
	// A dangling link: the write makes its target.
	must(os.Symlink("made", filepath.Join(dir, "dangling")))

	for _, user := range []string{"tuser", "root"} {
		err := g.CopyInThrough(t.Context(), dir, user, oneFile("d", "x"))
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("a write as %s onto a directory: %v, want InvalidArgument", user, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "d", "keep")); err != nil || string(b) != "keep" {
			t.Fatalf("after a write as %s onto its directory, d/keep: %q %v", user, b, err)
		}
	}
	must(g.CopyInThrough(t.Context(), dir, "tuser", oneFile("link", "new")))
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "real"))
	if b, _ := os.ReadFile(filepath.Join(dir, "real")); string(b) != "new" || err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("through the link, real holds %q (%v, %v), want new with its mode 0640", b, fi, err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4242 || st.Gid != 4243 {
		t.Fatalf("real owned by %d:%d, want the user's", st.Uid, st.Gid)
	}
	err = g.CopyInThrough(t.Context(), dir, "tuser", oneFile("evil", "pwned"))
	if err == nil || errdefs.ClassOf(err) == errdefs.Internal {
		t.Fatalf("a write as tuser through a link to root's file: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root's" {
		t.Fatalf("root's file was written through the user's link: %q", b)
	}
	// Root may: the user's credentials were its write's thread's alone.
	must(g.CopyInThrough(t.Context(), dir, "root", oneFile("evil", "root wrote")))
	if b, _ := os.ReadFile(secret); string(b) != "root wrote" {
		t.Fatalf("a write as root through the link: %q", b)
	}
	must(g.CopyInThrough(t.Context(), dir, "tuser", oneFile("dangling", "made")))
	if b, err := os.ReadFile(filepath.Join(dir, "made")); err != nil || string(b) != "made" {
		t.Fatalf("through a dangling link: %q %v", b, err)
	}
	// No temporary file is left beside what was written or refused.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if name := e.Name(); name[0] == '.' {
			t.Fatalf("left behind: %s", name)
		}
	}

	// CopyIn's docker cp semantics are unchanged: a file replaces a
	// directory and a link.
	must(g.CopyInAs(t.Context(), dir, "tuser", oneFile("link", "replaced")))
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("CopyIn onto a link: %v %v, want the link replaced", fi, err)
	}
}
