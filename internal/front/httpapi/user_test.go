package httpapi_test

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestExecAndUploadAsUser: the API's user runs a command as a user of the
// sandbox (its name, ids, home and login environment) and owns an upload.
func TestExecAndUploadAsUser(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	setup := `echo 'alice:x:1000:1001::/home/alice:/bin/sh' >>/etc/passwd
echo 'alice:x:1001:' >>/etc/group
echo 'staff2:x:1002:alice' >>/etc/group
mkdir -p /home/alice && chown 1000:1001 /home/alice`
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", setup}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	const script = `whoami; id -u; id -g; id -G; echo "$HOME $USER $LOGNAME $SHELL"; pwd`
	for _, tc := range []struct {
		name, user, workdir, want string
	}{
		{"default is the image's root", "", "", "root\n0\n0\n0\n/root   \n/\n"},
		{"by name", "alice", "", "alice\n1000\n1001\n1001 1002\n/home/alice alice alice /bin/sh\n/home/alice\n"},
		{"by uid:gid", "1000:1002", "/tmp", "alice\n1000\n1002\n1002\n/home/alice alice alice /bin/sh\n/tmp\n"},
		{"root by name", "root", "", "root\n0\n0\n0\n/root root root /bin/bash\n/root\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}, User: tc.user, Workdir: tc.workdir})
			if r.err != nil || r.st.Code != 0 {
				t.Fatalf("exec: %+v", r)
			}
			if r.stdout != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", r.stdout, tc.want)
			}
		})
	}
	t.Run("unknown user is a 400", func(t *testing.T) {
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"true"}, User: "mallory"})
		if !sdk.IsInvalidArgument(r.err) || !strings.Contains(r.err.Error(), "mallory") {
			t.Fatalf("exec as an unknown user: %+v", r)
		}
	})
	t.Run("upload owned by the user", func(t *testing.T) {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "note.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte("hi"))
		_ = tw.Close()
		if err := c.CopyToAs(t.Context(), sb.ID, "/home/alice/note.txt", "alice", &b); err != nil {
			t.Fatal(err)
		}
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"stat", "-c", "%U:%G", "/home/alice/note.txt"}})
		if r.stdout != "alice:alice\n" {
			t.Fatalf("owner %+v", r)
		}
		if err := c.CopyToAs(t.Context(), sb.ID, "/tmp/x", "mallory", bytes.NewReader(b.Bytes())); !sdk.IsInvalidArgument(err) {
			t.Fatalf("upload as an unknown user: %v", err)
		}
	})
}
