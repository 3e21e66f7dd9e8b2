package agent

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

func xattrDir(t *testing.T) string {
	dir := t.TempDir()
	f := filepath.Join(dir, "probe")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.probe", []byte("1"), 0); errors.Is(err, unix.ENOTSUP) {
		t.Skipf("%s keeps no user xattrs", dir)
	}
	return dir
}

func runXattr(req wire.Request) wire.ExitMsg {
	ch := &channel{req: req}
	if req.Op == wire.OpXattrGet {
		return ch.xattrGet()
	}
	return ch.xattrSet()
}

// TestXattrOps sets, replaces and reads a file's prefixed attributes,
// leaving other attributes alone, and refuses what it must.
func TestXattrOps(t *testing.T) {
	dir := xattrDir(t)
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.other", []byte("keep"), 0); err != nil {
		t.Fatal(err)
	}
	set := func(attrs map[string]string) wire.ExitMsg {
		return runXattr(wire.Request{Op: wire.OpXattrSet, Path: f, XattrPrefix: "user.e2b.", Xattrs: attrs})
	}
	get := func(paths ...string) []map[string]string {
		t.Helper()
		exit := runXattr(wire.Request{Op: wire.OpXattrGet, Paths: paths, XattrPrefix: "user.e2b."})
		if exit.Error != "" {
			t.Fatal(exit.Error)
		}
		var out []map[string]string
		if err := json.Unmarshal(exit.Info, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if exit := set(map[string]string{"a": "1", "b": "2"}); exit.Error != "" {
		t.Fatal(exit.Error)
	}
	if exit := set(map[string]string{"b": "3", "c": ""}); exit.Error != "" {
		t.Fatal(exit.Error)
	}
	missing := filepath.Join(dir, "missing")
	got := get(f, missing, filepath.Join(dir, "probe"))
	if want := []map[string]string{{"b": "3", "c": ""}, nil, nil}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if v, err := getxattr(f, "user.other"); err != nil || v != "keep" {
		t.Fatalf("user.other: %q, %v", v, err)
	}
	if exit := set(nil); exit.Error != "" || get(f)[0] != nil {
		t.Fatalf("clearing: %v %v", exit.Error, get(f))
	}

	link := filepath.Join(dir, "link")
	if err := os.Symlink(f, link); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]wire.Request{
		"missing path":  {Op: wire.OpXattrSet, Path: missing, XattrPrefix: "user.e2b.", Xattrs: map[string]string{"a": "1"}},
		"symlink":       {Op: wire.OpXattrSet, Path: link, XattrPrefix: "user.e2b.", Xattrs: map[string]string{"a": "1"}},
		"trusted.":      {Op: wire.OpXattrSet, Path: f, XattrPrefix: "trusted.", Xattrs: map[string]string{"a": "1"}},
		"security.":     {Op: wire.OpXattrGet, Paths: []string{f}, XattrPrefix: "security."},
		"relative path": {Op: wire.OpXattrGet, Paths: []string{"f"}, XattrPrefix: "user.e2b."},
		"unclean path":  {Op: wire.OpXattrGet, Paths: []string{dir + "/../f"}, XattrPrefix: "user.e2b."},
		"too many":      {Op: wire.OpXattrGet, Paths: make([]string, wire.MaxXattrPaths+1), XattrPrefix: "user.e2b."},
		"too big":       {Op: wire.OpXattrSet, Path: f, XattrPrefix: "user.e2b.", Xattrs: map[string]string{"a": strings.Repeat("v", wire.MaxXattrBytes)}},
		"empty key":     {Op: wire.OpXattrSet, Path: f, XattrPrefix: "user.e2b.", Xattrs: map[string]string{"": "v"}},
	} {
		exit := runXattr(req)
		want := errdefs.InvalidArgument
		if name == "missing path" {
			want = errdefs.NotFound
		}
		if exit.Error == "" || errdefs.Class(exit.ErrorClass) != want {
			t.Errorf("%s: %q (%s), want %s", name, exit.Error, exit.ErrorClass, want)
		}
	}
	if _, err := os.Stat(f); err != nil {
		t.Fatal(err)
	}
}

// TestXattrGetBounds leaves out a file whose prefixed attributes exceed
// the bound (set in the sandbox by anyone), rather than sending them.
func TestXattrGetBounds(t *testing.T) {
	// On tmpfs: ext4 keeps at most a block of a file's attributes, less
	// than the bound and its overhead.
	dir, err := os.MkdirTemp("/dev/shm", "clade-xattr")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := filepath.Join(dir, "big")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if err := unix.Setxattr(f, "user.e2b."+k, []byte(strings.Repeat("v", 3000)), 0); err != nil {
			t.Skipf("the file system keeps no 3000-byte xattrs: %v", err)
		}
	}
	exit := runXattr(wire.Request{Op: wire.OpXattrGet, Paths: []string{f}, XattrPrefix: "user.e2b."})
	if exit.Error != "" || string(exit.Info) != "[null]" {
		t.Fatalf("got %s %q", exit.Info, exit.Error)
	}
}

func getxattr(p, name string) (string, error) {
	b := make([]byte, 256)
	n, err := unix.Getxattr(p, name, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}
