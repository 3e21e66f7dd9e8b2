package main_test

import (
	"archive/tar"
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestMain: the tests with a daemon of their own (its data dir, socket and
// network share) run in parallel, two at a time (go test's -parallel on two
// cores): they spend most of their time waiting on a sandbox's boot, a
// snapshot or a terminal's screen, and none bounds an elapsed time. The one
// that writes into the shared images directory (TestCLIImageImport) stays
// sequential.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// cli runs the clade binary against the test daemon.
func cli(t *testing.T, d *testenv.Daemon, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(d.Bin, args...)
	cmd.Env = append(os.Environ(), "CLADE_HOST="+d.Socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

func TestCLI(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create", "--name", "cli-box", "--memory", "256", "--env", "FOO=bar")
	if code != 0 || len(strings.TrimSpace(out)) != 16 {
		t.Fatalf("create: %q %q %d", out, errs, code)
	}
	id := strings.TrimSpace(out)

	for _, tc := range []struct {
		name   string
		stdin  string
		args   []string
		stdout string
		code   int
		stderr string
	}{
		{"exec by name", "", []string{"exec", "cli-box", "--", "sh", "-c", "echo $FOO"}, "bar\n", 0, ""},
		{"exec exit code", "", []string{"exec", id, "--", "sh", "-c", "exit 9"}, "", 9, ""},
		{"exec not found", "", []string{"exec", id, "--", "nonexistent-cmd"}, "", 127, "not found"},
		{"exec not executable", "", []string{"exec", id, "--", "/etc/hostname"}, "", 126, "clade: /etc/hostname: permission denied (not an executable file)\n"},
		{"exec a directory", "", []string{"exec", id, "--", "/root"}, "", 126, "clade: /root: permission denied (not an executable file)\n"},
		{"exec signal", "", []string{"exec", id, "--", "sh", "-c", "kill -KILL $$"}, "", 137, ""},
		{"exec stdin", "abc\n", []string{"exec", "-i", id, "--", "cat"}, "abc\n", 0, ""},
		{"exec env workdir", "", []string{"exec", "--env", "X=1", "--workdir", "/tmp", id, "--", "sh", "-c", "echo $X $(pwd)"}, "1 /tmp\n", 0, ""},
		{"exec as a user", "", []string{"exec", "--user", "nobody", id, "--", "sh", "-c", "id -un; id -u; echo $HOME $USER; pwd"}, "nobody\n65534\n/nonexistent nobody\n/\n", 0, ""},
		{"exec as uid 0", "", []string{"exec", "-u", "0:0", id, "--", "sh", "-c", "id -u; echo $HOME"}, "0\n/root\n", 0, ""},
		{"exec as an unknown user", "", []string{"exec", "--user", "mallory", id, "--", "true"}, "", 1, `"mallory" not found in the sandbox's /etc/passwd`},
		{"exec timeout", "", []string{"exec", "--timeout", "200ms", id, "--", "sleep", "100"}, "", 124, "timed out"},
		{"exec unknown sandbox", "", []string{"exec", "nope", "--", "true"}, "", 1, "no such sandbox"},
		{"create bad memory", "", []string{"create", "--memory", "5"}, "", 1, "memory"},
		{"unknown verb", "", []string{"frobnicate"}, "", 2, "unknown verb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := cli(t, d, tc.stdin, tc.args...)
			if out != tc.stdout || code != tc.code || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("clade %v: stdout %q stderr %q code %d; want stdout %q code %d stderr containing %q",
					tc.args, out, errs, code, tc.stdout, tc.code, tc.stderr)
			}
		})
	}

	// rm of volumes and secrets, like rm of sandboxes: each removed one
	// printed, a failure said and the rest still removed, exit 1.
	t.Run("volume and secret rm", func(t *testing.T) {
		for _, v := range []string{"rm-a", "rm-b"} {
			if _, err := d.Client.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: v, SizeBytes: 16 << 20}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Client.SetSecret(t.Context(), v, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		for _, kind := range []string{"volume", "secret"} {
			out, errs, code := cli(t, d, "", kind, "rm", "rm-a", "nope", "rm-b")
			if code != 1 || out != "rm-a\nrm-b\n" || !strings.Contains(errs, "nope") {
				t.Fatalf("%s rm rm-a nope rm-b: stdout %q stderr %q code %d; want both removed and printed, exit 1", kind, out, errs, code)
			}
		}
		vols, err := d.Client.ListVolumes(t.Context())
		scs, err2 := d.Client.ListSecrets(t.Context())
		if err != nil || err2 != nil || len(vols) != 0 || len(scs) != 0 {
			t.Fatalf("left: volumes %+v (%v), secrets %+v (%v)", vols, err, scs, err2)
		}
	})

	t.Run("ls and inspect", func(t *testing.T) {
		out, _, code := cli(t, d, "", "ls")
		if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "cli-box") || !strings.Contains(out, "running") {
			t.Fatalf("ls: %q", out)
		}
		out, _, code = cli(t, d, "", "ls", "--json")
		if code != 0 || !strings.Contains(out, `"id": "`+id+`"`) {
			t.Fatalf("ls --json: %q", out)
		}
		// -q: the ids alone, for $(clade ls -q).
		out, _, code = cli(t, d, "", "ls", "-q")
		if lines := strings.Fields(out); code != 0 || !slices.Contains(lines, id) || slices.ContainsFunc(lines, func(l string) bool { return len(l) != 16 }) {
			t.Fatalf("ls -q: %q %d, want ids only, %s among them", out, code, id)
		}
		out, _, code = cli(t, d, "", "inspect", "cli-box")
		if code != 0 || !strings.Contains(out, `"memory_mib": 256`) {
			t.Fatalf("inspect: %q", out)
		}
		out, _, code = cli(t, d, "", "image", "ls")
		if code != 0 || !strings.Contains(out, "default") {
			t.Fatalf("image ls: %q", out)
		}
	})

	t.Run("cp both ways", func(t *testing.T) {
		src := t.TempDir()
		os.MkdirAll(filepath.Join(src, "tree", "sub"), 0o755)
		os.WriteFile(filepath.Join(src, "tree", "a.txt"), []byte("alpha"), 0o644)
		os.WriteFile(filepath.Join(src, "tree", "sub", "b.bin"), []byte{0, 1, 2, 255}, 0o600)
		os.Symlink("a.txt", filepath.Join(src, "tree", "link"))
		if _, errs, code := cli(t, d, "", "cp", filepath.Join(src, "tree"), id+":/root/"); code != 0 {
			t.Fatalf("cp in: %s", errs)
		}
		out, _, _ := cli(t, d, "", "exec", id, "--", "sh", "-c", "cat /root/tree/a.txt /root/tree/link; stat -c %a /root/tree/sub/b.bin")
		if out != "alphaalpha600\n" {
			t.Fatalf("inside: %q", out)
		}
		// A single file to a new name.
		if _, errs, code := cli(t, d, "", "cp", filepath.Join(src, "tree", "a.txt"), id+":/root/renamed.txt"); code != 0 {
			t.Fatalf("cp file: %s", errs)
		}
		dst := t.TempDir()
		if _, errs, code := cli(t, d, "", "cp", id+":/root/tree", filepath.Join(dst, "back")); code != 0 {
			t.Fatalf("cp out: %s", errs)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "back", "sub", "b.bin")); !bytes.Equal(b, []byte{0, 1, 2, 255}) {
			t.Fatalf("copied back: %v", b)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "back", "link")); string(b) != "alpha" {
			t.Fatalf("symlink copied back reads %q", b)
		}
		if _, errs, code := cli(t, d, "", "cp", id+":/root/renamed.txt", dst); code != 0 {
			t.Fatalf("cp file out: %s", errs)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "renamed.txt")); string(b) != "alpha" {
			t.Fatalf("file copied out reads %q", b)
		}
		// --user owns what is copied in.
		if _, errs, code := cli(t, d, "", "cp", "--user", "nobody", filepath.Join(src, "tree"), id+":/tmp/"); code != 0 {
			t.Fatalf("cp --user: %s", errs)
		}
		out, _, _ = cli(t, d, "", "exec", id, "--", "stat", "-c", "%U:%G", "/tmp/tree", "/tmp/tree/sub/b.bin")
		if out != "nobody:nogroup\nnobody:nogroup\n" {
			t.Fatalf("owners after cp --user: %q", out)
		}
		if _, errs, code := cli(t, d, "", "cp", "--user", "nobody", id+":/root/tree", dst); code == 0 || !strings.Contains(errs, "--user is for copies into a sandbox") {
			t.Fatalf("cp --user out: code %d %q", code, errs)
		}
		if _, errs, code := cli(t, d, "", "cp", id+":/nope", dst); code == 0 || !strings.Contains(errs, "no such file") {
			t.Fatalf("cp of a missing file: code %d %q", code, errs)
		}
		if _, errs, code := cli(t, d, "", "cp", id+":/missing", filepath.Join(dst, "x.out")); code == 0 || !strings.Contains(errs, "no such file") {
			t.Fatalf("cp of a missing file: code %d %q", code, errs)
		}
		if _, err := os.Lstat(filepath.Join(dst, "x.out")); !os.IsNotExist(err) {
			t.Fatalf("a failed cp left %s behind: %v", filepath.Join(dst, "x.out"), err)
		}
		if _, errs, code := cli(t, d, "", "exec", "--timeout", "1ns", id, "--", "true"); code == 0 || !strings.Contains(errs, "1ms") {
			t.Fatalf("exec --timeout 1ns: code %d %q, want refused naming 1ms", code, errs)
		}
		if _, errs, code := cli(t, d, "", "cp", id+":../etc/passwd", dst); code == 0 || !strings.Contains(errs, "absolute") {
			t.Fatalf("cp of a relative path: code %d %q", code, errs)
		}
		// As in docker cp: - is a tar archive on stdout or stdin.
		tarOut, errs, code := cli(t, d, "", "cp", id+":/root/tree", "-")
		if code != 0 {
			t.Fatalf("cp to -: %s", errs)
		}
		names := map[string]string{}
		tr := tar.NewReader(strings.NewReader(tarOut))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			b, _ := io.ReadAll(tr)
			names[h.Name] = string(b)
		}
		if names["tree/a.txt"] != "alpha" {
			t.Fatalf("cp to - wrote a tar of %v", names)
		}
		cli(t, d, "", "exec", id, "--", "mkdir", "/root/untarred")
		if _, errs, code := cli(t, d, tarOut, "cp", "-", id+":/root/untarred"); code != 0 {
			t.Fatalf("cp from -: %s", errs)
		}
		if out, _, _ := cli(t, d, "", "exec", id, "--", "cat", "/root/untarred/tree/a.txt"); out != "alpha" {
			t.Fatalf("cp from - unpacked %q", out)
		}
	})

	t.Run("help", func(t *testing.T) {
		for _, args := range [][]string{{"exec", "--help"}, {"exec", "-help"}, {"help", "exec"}, {"exec", "-h"}} {
			out, errs, code := cli(t, d, "", args...)
			if code != 0 || !strings.Contains(out, "clade exec [flags] ID [--] CMD") || !strings.Contains(out, "--timeout duration") {
				t.Fatalf("%q: %d %q %q", args, code, out, errs)
			}
		}
		out, _, code := cli(t, d, "", "image", "pull", "--help")
		if code != 0 || !strings.Contains(out, "clade image pull REF") || !strings.Contains(out, "--platform") || !strings.Contains(out, "--host") {
			t.Fatalf("image pull --help: %d %q", code, out)
		}
		// Usage errors exit 2 and say what is wrong on stderr.
		for _, tc := range []struct {
			args []string
			err  string
		}{
			{nil, "Usage:"},
			{[]string{"rm"}, "missing argument"},
			{[]string{"exec", id}, "missing"},
			{[]string{"ls", "--bogus"}, "unknown flag: --bogus"},
			{[]string{"image"}, "Available Commands"},
			{[]string{"image", "frob"}, `unknown verb "frob"`},
			{[]string{"fork", id, "-n", "x"}, "invalid argument"},
			{[]string{"create", "extra"}, `unexpected argument "extra"`},
		} {
			if _, errs, code := cli(t, d, "", tc.args...); code != 2 || !strings.Contains(errs, tc.err) {
				t.Errorf("clade %q: %d %q, want 2 and %q", tc.args, code, errs, tc.err)
			}
		}
	})

	t.Run("old flag forms", func(t *testing.T) {
		// The flag package's single-dash long flags and flags after the
		// arguments, as scripts wrote them.
		out, errs, code := cli(t, d, "", "ls", "-json")
		if code != 0 || !strings.Contains(out, `"id": "`+id+`"`) {
			t.Fatalf("ls -json: %d %q %q", code, out, errs)
		}
		out, errs, code = cli(t, d, "", "-host", d.Socket, "exec", "-env", "Y=2", "-workdir=/tmp", id, "sh", "-c", "echo $Y $(pwd) $0", "-json")
		if code != 0 || out != "2 /tmp -json\n" {
			t.Fatalf("exec with single-dash flags and no --: %d %q %q", code, out, errs)
		}
		out, errs, code = cli(t, d, "", "exec", id, "--", "sh", "-c", "echo $1", "sh", "--help")
		if code != 0 || out != "--help\n" {
			t.Fatalf("exec passes --help after -- on: %d %q %q", code, out, errs)
		}
		out, errs, code = cli(t, d, "", "snapshot", id, "-name", "old-form")
		if code != 0 || len(strings.TrimSpace(out)) != 16 {
			t.Fatalf("snapshot ID -name: %d %q %q", code, out, errs)
		}
		out, errs, code = cli(t, d, "", "snapshot", "ls", "-json")
		if code != 0 || !strings.Contains(out, `"name": "old-form"`) {
			t.Fatalf("snapshot ls -json: %d %q %q", code, out, errs)
		}
		out, errs, code = cli(t, d, "", "fork", "old-form", "-n", "2", "-json")
		if code != 0 || strings.Count(out, `"id"`) != 2 {
			t.Fatalf("fork SNAP -n 2 -json: %d %q %q", code, out, errs)
		}
		var kids []string
		for _, l := range strings.Split(out, "\n") {
			if _, v, ok := strings.Cut(l, `"id": "`); ok {
				kids = append(kids, strings.TrimRight(strings.TrimSpace(v), `",`))
			}
		}
		if out, errs, code := cli(t, d, "", append([]string{"rm"}, kids...)...); code != 0 {
			t.Fatalf("rm children: %q %q", out, errs)
		}
		if _, errs, code := cli(t, d, "", "snapshot", "rm", "old-form"); code != 0 {
			t.Fatalf("snapshot rm: %q", errs)
		}
	})

	t.Run("rm", func(t *testing.T) {
		if out, errs, code := cli(t, d, "", "rm", "cli-box"); code != 0 || out != "cli-box\n" {
			t.Fatalf("rm: %q %q %d", out, errs, code)
		}
		if _, errs, code := cli(t, d, "", "rm", "cli-box"); code != 1 || !strings.Contains(errs, "no such sandbox") {
			t.Fatalf("second rm: %q %d, want a not-found error", errs, code)
		}
		if _, errs, code := cli(t, d, "", "rm", "-f", "cli-box"); code != 0 {
			t.Fatalf("rm -f of a removed sandbox: %q %d, want success", errs, code)
		}
	})
}

func TestCLISnapshotForkSleep(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create", "--name", "src")
	if code != 0 {
		t.Fatalf("create: %s", errs)
	}
	src := strings.TrimSpace(out)
	cli(t, d, "", "exec", "src", "--", "sh", "-c", "echo seed > /root/seed")

	out, errs, code = cli(t, d, "", "snapshot", "src", "--name", "snap1")
	if code != 0 || len(strings.TrimSpace(out)) != 16 {
		t.Fatalf("snapshot: %q %q %d", out, errs, code)
	}
	out, _, _ = cli(t, d, "", "snapshot", "ls")
	if !strings.Contains(out, "snap1") || !strings.Contains(out, src) {
		t.Fatalf("snapshot ls: %q", out)
	}

	out, errs, code = cli(t, d, "", "fork", "snap1", "-n", "3")
	kids := strings.Fields(out)
	if code != 0 || len(kids) != 3 {
		t.Fatalf("fork: %q %q %d", out, errs, code)
	}
	for _, k := range kids {
		if o, _, _ := cli(t, d, "", "exec", k, "--", "cat", "/root/seed"); o != "seed\n" {
			t.Fatalf("child %s: %q", k, o)
		}
	}
	if _, errs, code := cli(t, d, "", "snapshot", "rm", "snap1"); code != 1 || !strings.Contains(errs, "in use") {
		t.Fatalf("snapshot rm in use: %d %q", code, errs)
	}
	out, _, code = cli(t, d, "", "fork", "src", "-n", "1", "--json")
	if code != 0 || !strings.Contains(out, `"children"`) {
		t.Fatalf("fork --json: %q", out)
	}
	if _, errs, code := cli(t, d, "", "fork", "src", "-n", "0"); code != 2 || !strings.Contains(errs, "1 or more") {
		t.Fatalf("fork -n 0: %d %q", code, errs)
	}
	out, errs, code = cli(t, d, "", "create", "--from", "snap1", "--name", "single")
	if code != 0 {
		t.Fatalf("create --from: %q", errs)
	}

	if _, errs, code := cli(t, d, "", "sleep", "src"); code != 0 {
		t.Fatalf("sleep: %q", errs)
	}
	out, _, _ = cli(t, d, "", "ls")
	if !strings.Contains(out, "sleeping") {
		t.Fatalf("ls after sleep: %q", out)
	}
	// A sleeping sandbox cannot be snapshotted or forked: the error says
	// how to go on.
	for _, args := range [][]string{{"snapshot", "src"}, {"fork", "src", "-n", "1"}} {
		if _, errs, code := cli(t, d, "", args...); code != 1 || !strings.Contains(errs, "clade wake ") {
			t.Fatalf("%v of a sleeping sandbox: %d %q, want exit 1 saying to wake it", args, code, errs)
		}
	}
	// --node is a cluster's: a single daemon refuses it, and the sandbox
	// stays asleep.
	if _, errs, code := cli(t, d, "", "wake", "src", "--node", "n2"); code != 1 || !strings.Contains(errs, "not part of a cluster") {
		t.Fatalf("wake --node on a single daemon: %d %q, want exit 1 saying it is not a cluster", code, errs)
	}
	if out, _, _ := cli(t, d, "", "ls"); !strings.Contains(out, "sleeping") {
		t.Fatalf("ls after a refused wake --node: %q", out)
	}
	if _, errs, code := cli(t, d, "", "wake", "src"); code != 0 {
		t.Fatalf("wake: %q", errs)
	}
	if o, _, _ := cli(t, d, "", "exec", "src", "--", "cat", "/root/seed"); o != "seed\n" {
		t.Fatalf("after wake: %q", o)
	}
	if _, errs, code := cli(t, d, "", "wake", "nope"); code != 1 || !strings.Contains(errs, "no such sandbox") {
		t.Fatalf("wake unknown: %d %q", code, errs)
	}

	// sleep --label: the matching running sandboxes, each printed; none
	// matching is said (a mistyped label), not an error.
	out, errs, code = cli(t, d, "", "create", "--label", "team=sleepy")
	if code != 0 {
		t.Fatalf("create --label: %q", errs)
	}
	labeled := strings.TrimSpace(out)
	if out, errs, code := cli(t, d, "", "sleep", "--label", "team=sleepy"); code != 0 || out != labeled+"\n" {
		t.Fatalf("sleep --label team=sleepy: %q %q %d, want %s slept", out, errs, code, labeled)
	}
	if out, errs, code := cli(t, d, "", "sleep", "--label", "team=nobody"); code != 0 || out != "" || !strings.Contains(errs, "no running sandbox matched") {
		t.Fatalf("sleep --label team=nobody: %q %q %d, want nothing slept and said so", out, errs, code)
	}
}

func TestCLIImageImport(t *testing.T) {
	d := testenv.StartDaemon(t)
	// An OCI layout directory and a docker-save tarball of a one-file image.
	layer := static.NewLayer([]byte(""), types.OCIUncompressedLayer)
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/tiny:v1")
	if err := tarball.WriteToFile(filepath.Join(dir, "save.tar"), tag, img); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ src, name string }{{filepath.Join(dir, "layout"), "tiny-layout"}, {filepath.Join(dir, "save.tar"), "tiny-save"}} {
		out, errs, code := cli(t, d, "", "image", "import", tc.src, "--name", tc.name)
		if code != 0 || out != tc.name+"\n" {
			t.Fatalf("import %s: %q %q %d", tc.src, out, errs, code)
		}
		out, _, code = cli(t, d, "", "image", "inspect", tc.name)
		if code != 0 || !strings.Contains(out, `"layers"`) {
			t.Fatalf("inspect %s: %q", tc.name, out)
		}
		if _, errs, code := cli(t, d, "", "image", "rm", tc.name); code != 0 {
			t.Fatalf("rm %s: %q", tc.name, errs)
		}
	}
	if _, errs, code := cli(t, d, "", "image", "import", dir); code != 1 || !strings.Contains(errs, "oci-layout") {
		t.Fatalf("import of a plain directory: %d %q", code, errs)
	}
}

// TestCLIInterrupted: Ctrl-C during a call the daemon has not answered says
// "interrupted" and exits 130, not with the HTTP client's error text.
func TestCLIInterrupted(t *testing.T) {
	bin, _ := testenv.Binaries(t)
	sock := filepath.Join(t.TempDir(), "hang.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // a create that takes long
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	cmd := exec.Command(bin, "--host", sock, "create")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the create never reached the server")
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 130 || strings.TrimSpace(errb.String()) != "clade: interrupted" {
		t.Fatalf("interrupted create: %v, stderr %q; want exit 130 and \"clade: interrupted\"", err, errb.String())
	}
}
