package e2b

import (
	"errors"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem"
	"github.com/clade-sandbox/clade/internal/image"
)

// TestDefaultImage keeps the front's name of the default image (it does
// not import the image store) the image store's.
func TestDefaultImage(t *testing.T) {
	if DefaultImage != image.Default {
		t.Errorf("DefaultImage is %q, the image store's default %q", DefaultImage, image.Default)
	}
}

func TestResolve(t *testing.T) {
	for in, want := range map[string]string{
		"":              Home,
		"~":             Home,
		"~/a/b":         Home + "/a/b",
		"rel.txt":       Home + "/rel.txt",
		"dir/../x":      Home + "/x",
		"/tmp/x":        "/tmp/x",
		"/tmp//y/./z/":  "/tmp/y/z",
		"/../etc/hosts": "/etc/hosts",
	} {
		if got := resolve(in); got != want {
			t.Errorf("resolve(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseEntry(t *testing.T) {
	for _, tc := range []struct {
		rec      string
		typ      filesystem.FileType
		name     string
		path     string
		size     int64
		perms    string
		target   string
		wantFail bool
	}{
		{rec: "f\t10\t644\troot\troot\t1700000000.5\t\t/home/user/a\tb.txt", typ: filesystem.FileType_FILE_TYPE_FILE, name: "a\tb.txt", path: "/home/user/a\tb.txt", size: 10, perms: "-rw-r--r--"},
		{rec: "d\t4096\t755\tuser\tuser\t1700000000\t\t/home/user", typ: filesystem.FileType_FILE_TYPE_DIRECTORY, name: "user", path: "/home/user", size: 4096, perms: "drwxr-xr-x"},
		{rec: "l\t7\t777\troot\troot\t1700000000\t/target\t/tmp/link", typ: filesystem.FileType_FILE_TYPE_SYMLINK, name: "link", path: "/tmp/link", size: 7, perms: "Lrwxrwxrwx", target: "/target"},
		{rec: "f\t1\t644", wantFail: true},
	} {
		e, err := parseEntry(tc.rec)
		if tc.wantFail {
			if err == nil {
				t.Errorf("parseEntry(%q) succeeded, want an error", tc.rec)
			}
			continue
		}
		if err != nil {
			t.Fatalf("parseEntry(%q): %v", tc.rec, err)
		}
		if e.Type != tc.typ || e.Name != tc.name || e.Path != tc.path || e.Size != tc.size || e.Permissions != tc.perms || e.GetSymlinkTarget() != tc.target {
			t.Errorf("parseEntry(%q) = %v", tc.rec, e)
		}
	}
}

func TestEndEvent(t *testing.T) {
	for _, tc := range []struct {
		exit   api.ExitStatus
		err    error
		code   int32
		exited bool
		status string
		hasErr bool
	}{
		{exit: api.ExitStatus{Code: 0}, exited: true, status: "exit status 0"},
		{exit: api.ExitStatus{Code: 3}, code: 3, exited: true, status: "exit status 3"},
		{exit: api.ExitStatus{Code: 137, Signal: 9}, code: 137, status: "signal: killed"},
		{exit: api.ExitStatus{Code: 137, Signal: 9, TimedOut: true}, code: 137, status: "signal: killed", hasErr: true},
		{exit: api.ExitStatus{Code: 127, Error: "no such command"}, code: 127, status: "error: no such command", hasErr: true},
		{err: errors.New("connection lost"), code: -1, status: "error", hasErr: true},
	} {
		e := endEvent(tc.exit, tc.err)
		if e.ExitCode != tc.code || e.Exited != tc.exited || e.Status != tc.status || (e.Error != nil) != tc.hasErr {
			t.Errorf("endEvent(%+v, %v) = %v", tc.exit, tc.err, e)
		}
	}
}

func TestStatusOf(t *testing.T) {
	for c, want := range map[errdefs.Class]int{
		errdefs.NotFound: 404, errdefs.Conflict: 409, errdefs.AlreadyExists: 409, errdefs.InvalidArgument: 400,
		errdefs.Unauthenticated: 401, errdefs.ResourceExhausted: 429, errdefs.Unavailable: 503, errdefs.Internal: 500,
	} {
		if got := statusOf(c); got != want {
			t.Errorf("statusOf(%s) = %d, want %d", c, got, want)
		}
	}
}

func TestNewNeedsAKey(t *testing.T) {
	if _, err := New(Config{}, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New without a key: %v, want invalid argument", err)
	}
}

// TestUploadMetadata reads X-Metadata-* headers as envd does: keys lower
// cased, the first of repeated headers, printable US-ASCII only, bounded.
func TestUploadMetadata(t *testing.T) {
	h := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	// A header named just X-Metadata- names no key: it is not metadata.
	md, err := uploadMetadata(h("X-Metadata-Owner", "alice", "X-Metadata-Owner", "bob", "x-metadata-Build-Id", "42", "Content-Type", "x", "X-Metadata-", "no key"))
	if err != nil || len(md) != 2 || md["owner"] != "alice" || md["build-id"] != "42" {
		t.Fatalf("got %v, %v", md, err)
	}
	if md, err := uploadMetadata(h("Content-Type", "x")); err != nil || md != nil {
		t.Fatalf("no metadata: %v, %v", md, err)
	}
	for name, hdr := range map[string]map[string][]string{
		"control char": h("X-Metadata-K", "a\tb"),
		"non-ASCII":    h("X-Metadata-K", "é"),
		"long key":     h("X-Metadata-"+strings.Repeat("k", maxMetadataKey+1), "v"),
		"too much":     h("X-Metadata-A", strings.Repeat("v", 3000), "X-Metadata-B", strings.Repeat("v", 1100)),
	} {
		if _, err := uploadMetadata(hdr); errdefs.ClassOf(err) != errdefs.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := uploadMetadata(h("X-Metadata-"+strings.Repeat("k", maxMetadataKey), "v")); err != nil {
		t.Errorf("a key at the bound: %v", err)
	}
}
