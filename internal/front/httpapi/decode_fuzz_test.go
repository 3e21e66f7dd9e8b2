package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"path"
	"reflect"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// decodeSeeds are request bodies clients send, right and wrong.
var decodeSeeds = []string{
	``,
	` `,
	`{}`,
	`null`,
	`[]`,
	`"x"`,
	`{"name":"web","image":"default","memory_mib":256,"cpus":0.5,"env":["A=1"]}`,
	`{"cmd":["sh","-c","echo hi"],"env":["A=1"],"workdir":"/tmp","timeout_ms":1000,"stdin":true}`,
	`{"cmd":["ls"]} {"cmd":["ls"]}`,
	`{"cmd":["ls"]`,
	`{"cmd":"ls"}`,
	`{"memory_mib":1e400}`,
	`{"memory_mib":-1,"cpus":-0.0}`,
	`{"bogus":1}`,
	`{"CMD":["ls"],"Cmd":["x"]}`,
	"{\"name\":\"\xff\xfe\"}",
	`{"timeout_ms":9223372036854775808}`,
}

// FuzzDecodeCreate feeds arbitrary bodies to decode for the request types of
// POST /v1/sandboxes and POST /v1/sandboxes/{id}/exec.
func FuzzDecodeCreate(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, target := range []any{&api.CreateSandboxRequest{}, &api.ExecRequest{}} {
			r := httptest.NewRequest("POST", "/v1/sandboxes", bytes.NewReader(body))
			err := decode(r, target)
			if err != nil {
				if c := errdefs.ClassOf(err); c != errdefs.InvalidArgument {
					t.Fatalf("decode(%q) into %T: error class %s, want %s: %v", body, target, c, errdefs.InvalidArgument, err)
				}
				continue
			}
			if len(body) > maxBody {
				continue
			}
			// Whatever the strict decoder accepts, the lenient one must
			// accept too, with the same result.
			want := reflect.New(reflect.TypeOf(target).Elem()).Interface()
			if err := json.Unmarshal(body, want); err != nil {
				t.Fatalf("decode accepted %q into %T, but json.Unmarshal refuses it: %v", body, target, err)
			}
			if !reflect.DeepEqual(target, want) {
				t.Fatalf("decode(%q) = %+v, json.Unmarshal gives %+v", body, target, want)
			}
		}
	})
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string // substring; "" means success
		want    api.ExecRequest
	}{
		{name: "empty body", body: ``, wantErr: "empty request body"},
		{name: "only whitespace", body: " \n", wantErr: "empty request body"},
		{name: "malformed", body: `{"cmd":[`, wantErr: "malformed JSON body"},
		{name: "wrong type", body: `{"cmd":"ls"}`, wantErr: "malformed JSON body"},
		{name: "unknown field", body: `{"cmd":["ls"],"bogus":1}`, wantErr: `unknown field "bogus"`},
		{name: "trailing object", body: `{"cmd":["ls"]} {}`, wantErr: "unexpected data after the object"},
		{name: "trailing garbage", body: `{"cmd":["ls"]} x`, wantErr: "unexpected data after the object"},
		{name: "trailing closer", body: `{"cmd":["ls"]}}`, wantErr: "unexpected data after the object"},
		{name: "too large", body: `{"cmd":["` + strings.Repeat("a", maxBody) + `"]}`, wantErr: "larger than"},
		{name: "valid", body: `{"cmd":["ls","-l"],"env":["A=1"],"workdir":"/tmp","timeout_ms":5,"stdin":true}`,
			want: api.ExecRequest{Cmd: []string{"ls", "-l"}, Env: []string{"A=1"}, Workdir: "/tmp", TimeoutMS: 5, Stdin: true}},
		{name: "valid with trailing newline", body: "{\"cmd\":[\"ls\"]}\n", want: api.ExecRequest{Cmd: []string{"ls"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got api.ExecRequest
			err := decode(httptest.NewRequest("POST", "/v1/sandboxes/x/exec", strings.NewReader(tt.body)), &got)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("decode(%q): %v", tt.body, err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("decode(%q) = %+v, want %+v", tt.body, got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("decode(%q) succeeded, want an error containing %q", tt.body, tt.wantErr)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("decode(%q): class %s, want %s", tt.body, errdefs.ClassOf(err), errdefs.InvalidArgument)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("decode(%q) = %q, want it to contain %q", tt.body, err, tt.wantErr)
			}
		})
	}
}

// FuzzSandboxPath checks that every path sandboxPath accepts is absolute,
// clean and cannot climb out of a directory.
func FuzzSandboxPath(f *testing.F) {
	for _, s := range []string{"", "/", "/tmp/x", "tmp", "/a/../b", "/..", "/a/..", "//a//b/", "/a/./b",
		"/a/..b", "/a/b..", "/a\x00b", "/./", "/...", ".", "/a/.../"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := sandboxPath(p)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("sandboxPath(%q): class %s, want %s: %v", p, errdefs.ClassOf(err), errdefs.InvalidArgument, err)
			}
			return
		}
		if !path.IsAbs(got) {
			t.Fatalf("sandboxPath(%q) = %q, not absolute", p, got)
		}
		if path.Clean(got) != got {
			t.Fatalf("sandboxPath(%q) = %q, not clean", p, got)
		}
		if strings.ContainsRune(got, 0) {
			t.Fatalf("sandboxPath(%q) = %q, has a NUL byte", p, got)
		}
		for _, part := range strings.Split(got, "/") {
			if part == ".." {
				t.Fatalf("sandboxPath(%q) = %q, has a '..' component", p, got)
			}
		}
		// Accepted paths name what the client wrote, not somewhere else.
		if path.Clean(p) != got {
			t.Fatalf("sandboxPath(%q) = %q, want path.Clean = %q", p, got, path.Clean(p))
		}
	})
}

// FuzzEventsQuery: any query of GET /v1/events parses or is an
// InvalidArgument error, never a panic; labels parse to non-empty keys.
func FuzzEventsQuery(f *testing.F) {
	for _, s := range []string{"", "follow=false", "since=0", "since=1796113556456008&sandbox=web&label=a=b&label=c=",
		"since=-1", "since=99999999999999999999", "follow=yes", "label==x", "label=x", "%zz", "label=a%3Db%3Dc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		r := httptest.NewRequest("GET", "/v1/events", nil)
		r.URL.RawQuery = q
		eq, err := parseEventsQuery(r)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("query %q: %v, want an invalid argument error", q, err)
			}
			return
		}
		for k := range eq.filter.Labels {
			if k == "" {
				t.Fatalf("query %q: an empty label key", q)
			}
		}
	})
}
