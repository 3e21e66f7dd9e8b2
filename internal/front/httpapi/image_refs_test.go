package httpapi_test

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestImageRefs: the reference an image was pulled or imported as names it
// wherever a name does (create, inspect, rm, build --from), `image ls`
// shows it, and a reference never pulled is a 404 that says how to pull it.
func TestImageRefs(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	ref := host + "/team/app:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img := testImage(t)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	pulled, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: ref, Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Ref != ref || pulled.Name == ref {
		t.Fatalf("pulled image: %+v", pulled)
	}

	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Image: ref, MemoryMiB: 128})
	if sb.Image != pulled.Name {
		t.Errorf("sandbox of %s records image %q, want %q", ref, sb.Image, pulled.Name)
	}
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"whoami"}}); r.err != nil || r.stdout != "hello-from-image /work 1000 1000\n" {
		t.Fatalf("exec in a sandbox created by reference: %+v", r)
	}
	got, err := c.GetImage(t.Context(), ref)
	if err != nil || got.Name != pulled.Name || len(got.UsedBy) != 1 {
		t.Fatalf("inspect by reference: %+v %v", got, err)
	}
	if err := c.DeleteImage(t.Context(), ref); !sdk.IsConflict(err) {
		t.Fatalf("rm by reference of an image in use: %v", err)
	}
	imgs, err := c.ListImages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, i := range imgs {
		listed = listed || (i.Name == pulled.Name && i.Ref == ref)
	}
	if !listed {
		t.Errorf("image ls does not show the reference: %+v", imgs)
	}
	out, errs, code := cliRun(t, d, "image", "ls")
	if code != 0 || !strings.Contains(out, ref) {
		t.Errorf("clade image ls: %q %q %d", out, errs, code)
	}

	// build --from a reference.
	built, err := c.Build(t.Context(), sdk.BuildRequest{Name: "from-ref", From: ref})
	if err != nil {
		t.Fatalf("build --from %s: %v", ref, err)
	}
	if !strings.Contains(built.Source, "built from "+pulled.Name) {
		t.Errorf("built image source %q", built.Source)
	}
	if err := c.DeleteImage(t.Context(), "from-ref"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteImage(t.Context(), ref); err != nil {
		t.Fatalf("rm by reference: %v", err)
	}
	if _, err := c.GetImage(t.Context(), pulled.Name); !sdk.IsNotFound(err) {
		t.Fatalf("image after rm by reference: %v", err)
	}

	// Never pulled: a 404 that says how to pull it, to inspect and to create.
	never := host + "/team/never:v1"
	if _, err := c.GetImage(t.Context(), never); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), "clade image pull "+never) {
		t.Errorf("inspect of a reference never pulled: %v", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Image: "python:3.12-slim"}); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), "clade image pull python:3.12-slim") {
		t.Errorf("create from a reference never pulled: %v", err)
	}
	// Hostile names are refused before they go anywhere.
	for _, bad := range []string{"evil\x1b]0;pwned\x07", strings.Repeat("a", 600), "a b"} {
		if _, err := c.GetImage(t.Context(), bad); !sdk.IsInvalidArgument(err) {
			t.Errorf("inspect %q: %v, want invalid argument", bad, err)
		}
		if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Image: bad}); !sdk.IsInvalidArgument(err) {
			t.Errorf("create from %q: %v, want invalid argument", bad, err)
		}
	}

	// An imported image answers to its tag, in Docker's short form too;
	// its source is the file the client named, not the daemon's upload.
	p := filepath.Join(t.TempDir(), "python.tar")
	if err := tarball.WriteToFile(p, mustTag(t, "python:3.12-slim"), img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	imported, err := c.ImportImage(t.Context(), f, sdk.ImportImageRequest{Source: "python.tar"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if imported.Name != "python-3.12-slim" || imported.Ref != "python:3.12-slim" || imported.Source != "python.tar" {
		t.Fatalf("imported image: %+v", imported)
	}
	for _, r := range []string{"python:3.12-slim", "docker.io/library/python:3.12-slim", "index.docker.io/library/python:3.12-slim"} {
		if got, err := c.GetImage(t.Context(), r); err != nil || got.Name != imported.Name {
			t.Errorf("inspect %s: %+v %v", r, got, err)
		}
	}
	if err := c.DeleteImage(t.Context(), "python:3.12-slim"); err != nil {
		t.Fatal(err)
	}
	// The CLI sends the file name it was given.
	out, errs, code = cliRun(t, d, "image", "import", p, "--quiet")
	if code != 0 {
		t.Fatalf("clade image import: %q %q", out, errs)
	}
	if got, err := c.GetImage(t.Context(), strings.TrimSpace(out)); err != nil || got.Source != p {
		t.Fatalf("source of a CLI import: %+v %v, want %s", got, err, p)
	}
	if err := c.DeleteImage(t.Context(), strings.TrimSpace(out)); err != nil {
		t.Fatal(err)
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// cliRun runs the clade binary against the test's daemon.
func cliRun(t *testing.T, d *testenv.Daemon, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(d.Bin, args...)
	cmd.Env = append(os.Environ(), "CLADE_HOST="+d.Socket)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}
