package agent_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// userAgent runs the real agent in this process with its accounts read
// from etc, connected to a guest.Conn over a real unix socket.
func userAgent(t *testing.T, etc string) *guest.Conn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := guest.NewConn()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_ = g.Serve(nc)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = agent.New(agent.Config{Socket: sock, Accounts: etc}).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		g.Close(nil)
		ln.Close()
		<-served
	})
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if err := g.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	return g
}

// worldDir makes a directory every user can enter (t.TempDir's parents
// are root's only).
func worldDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "clade-user-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func run(t *testing.T, g *guest.Conn, req guest.ExecRequest) (string, guest.ExitStatus) {
	t.Helper()
	p, err := g.Exec(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out, errb bytes.Buffer
	done := make(chan struct{})
	go func() { defer close(done); _, _ = io.Copy(&errb, p.Stderr) }()
	_, _ = io.Copy(&out, p.Stdout)
	<-done
	st, err := p.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 0 {
		t.Fatalf("%v: exit %+v, stderr %q", req.Argv, st, errb.String())
	}
	return out.String(), st
}

// TestExecAsUser runs real processes as users of an account database the
// test writes, as a sandbox's /etc would hold them (with junk lines a
// process inside may have planted).
func TestExecAsUser(t *testing.T) {
	testenv.RequireRoot(t)
	etc := t.TempDir()
	home := worldDir(t)
	if err := os.Chown(home, 4242, 4243); err != nil {
		t.Fatal(err)
	}
	passwd := "# comment\n\n+nis\njunk\nbad:x:notanumber:1::/:/bin/sh\n" + strings.Repeat("x", 100<<10) + "\n" +
		"root:x:0:0:root:/root:/bin/bash\n" +
		"tuser:x:4242:4243:Test User:" + home + ":/bin/sh\n"
	group := "root:x:0:\ntgroup:x:4243:\nextra:x:4244:root,tuser\nother:x:4245:someone\n:::\n"
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	g := userAgent(t, etc)
	const script = `id -u; id -g; id -G; echo "$HOME $USER $LOGNAME $SHELL"; pwd`
	for _, tc := range []struct {
		name, user string
		env        []string
		dir        string
		want       string
	}{
		{"by name", "tuser", nil, "", "4242\n4243\n4243 4244\n" + home + " tuser tuser /bin/sh\n" + home + "\n"},
		{"by uid", "4242", nil, "", "4242\n4243\n4243 4244\n" + home + " tuser tuser /bin/sh\n" + home + "\n"},
		{"uid:gid", "4242:4244", nil, "", "4242\n4244\n4244\n" + home + " tuser tuser /bin/sh\n" + home + "\n"},
		{"name:group", "tuser:extra", nil, "/", "4242\n4244\n4244\n" + home + " tuser tuser /bin/sh\n/\n"},
		{"uid unknown to passwd", "5555", nil, "", "5555\n5555\n5555\n/ 5555 5555 \n/\n"},
		{"root", "root", nil, "/", "0\n0\n0 4244\n/root root root /bin/bash\n/\n"},
		{"request env wins", "tuser", []string{"HOME=/elsewhere"}, "", "4242\n4243\n4243 4244\n/elsewhere tuser tuser /bin/sh\n" + home + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := run(t, g, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: tc.user, Env: tc.env, Dir: tc.dir})
			if out != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", out, tc.want)
			}
		})
	}
	t.Run("unknown user is an error", func(t *testing.T) {
		for _, u := range []string{"nosuch", "tuser:nosuchgroup", ":", "a\nb"} {
			_, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"/bin/true"}, User: u})
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("user %q: err %v, want InvalidArgument", u, err)
			}
		}
		_, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"/bin/true"}, User: "nosuch"})
		if err == nil || !strings.Contains(err.Error(), `"nosuch" not found in the sandbox's /etc/passwd`) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("upload owned by the user", func(t *testing.T) {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "d/", Mode: 0o755, Typeflag: tar.TypeDir})
		_ = tw.WriteHeader(&tar.Header{Name: "d/f", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg, Uid: 7, Gid: 7})
		_, _ = tw.Write([]byte("hi"))
		_ = tw.Close()
		dst := t.TempDir()
		if err := g.CopyInAs(t.Context(), dst, "tuser", &b); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"d", "d/f"} {
			fi, err := os.Lstat(filepath.Join(dst, p))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != 4242 || st.Gid != 4243 {
				t.Fatalf("%s owned by %d:%d, want 4242:4243", p, st.Uid, st.Gid)
			}
		}
		if err := g.CopyInAs(t.Context(), dst, "nosuch", bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("upload as an unknown user: %v", err)
		}
	})
}

// TestExecAsUserHostileAccounts: account files that are not regular files
// (a FIFO would block a read forever) name nobody.
func TestExecAsUserHostileAccounts(t *testing.T) {
	testenv.RequireRoot(t)
	etc := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(etc, "passwd"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := userAgent(t, etc)
	_, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"/bin/true"}, User: "root"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err %v, want InvalidArgument", err)
	}
	out, _ := run(t, g, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u"}, User: "0"})
	if out != "0\n" {
		t.Fatalf("id -u: %q", out)
	}
}

// TestExecAsUserJunk: names with '/' or ':' junk are clear errors, a huge
// passwd file is read only up to its bound (a user past it is unknown), and
// uid 0 in its numeric form is the sandbox's own root.
func TestExecAsUserJunk(t *testing.T) {
	testenv.RequireRoot(t)
	etc := t.TempDir()
	filler := strings.Repeat("filler:x:1:1::/:/bin/sh\n", (5<<20)/24)
	passwd := "root:x:0:0:root:/root:/bin/sh\nnear:x:4300:4300::/:/bin/sh\n" + filler + "far:x:4301:4301::/:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := userAgent(t, etc)
	for _, u := range []string{"../../etc/passwd", "root/..", "root:x:0", "a:b:c", "::", "root:", ":0", "far", strings.Repeat("u", 300), "-1", "4294967296"} {
		_, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"/bin/true"}, User: u})
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("user %.40q: err %v, want InvalidArgument", u, err)
		}
	}
	for u, want := range map[string]string{"near": "4300\n", "0": "0\n", "0:0": "0\n", "root": "0\n"} {
		out, _ := run(t, g, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u"}, User: u})
		if out != want {
			t.Fatalf("user %q: id -u %q, want %q", u, out, want)
		}
	}
}
