package httpapi_test

import (
	"archive/tar"
	"bytes"
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
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// whoami is a static program for the test image: it prints what an exec
// runs with.
const whoami = `package main

import (
	"fmt"
	"os"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Println(os.Getenv("GREETING"), wd, os.Getuid(), os.Getgid())
}
`

// testImage builds a small OCI image: a static binary, a user, a working
// directory, and a config that uses them.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(whoami), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "whoami"), "main.go")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build whoami: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(dir, "whoami"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(body)
	}
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "bin/whoami", Typeflag: tar.TypeReg, Mode: 0o755}, bin)
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/work:/bin/sh\n"))
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:\napp:x:1000:\n"))
	add(&tar.Header{Name: "work/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}, nil)
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Env = []string{"PATH=/bin", "GREETING=hello-from-image"}
	cfg.Config.WorkingDir = "/work"
	cfg.Config.User = "app"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImagePullAndRun(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host+"/tools/whoami:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, testImage(t)); err != nil {
		t.Fatal(err)
	}

	var calls int
	img, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: ref.String(), Name: "whoami", Insecure: true}, func(sdk.ImageProgress) { calls++ })
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	if img.Name != "whoami" || img.Config == nil || img.Config.User != "app" || len(img.Layers) != 1 {
		t.Fatalf("pulled image: %+v", img)
	}
	if calls == 0 {
		t.Errorf("no progress reported")
	}

	sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Image: "whoami", MemoryMiB: 128})
	if err != nil {
		t.Fatalf("create from the pulled image: %v", err)
	}
	// The image's Env, WorkingDir and User are every exec's defaults.
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"whoami"}}); r.err != nil || r.stdout != "hello-from-image /work 1000 1000\n" {
		t.Fatalf("exec in the pulled image: %+v", r)
	}
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"whoami"}, Env: []string{"GREETING=override"}, Workdir: "/"}); r.stdout != "override / 1000 1000\n" {
		t.Fatalf("exec with overrides: %+v", r)
	}

	// In use: neither removed nor replaced.
	if err := c.DeleteImage(t.Context(), "whoami"); !sdk.IsConflict(err) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("removing an image in use: %v, want a conflict naming the sandbox", err)
	}
	if _, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: ref.String(), Name: "whoami", Insecure: true}, nil); err != nil {
		t.Fatalf("pulling the same image again (nothing to replace): %v", err)
	}
	v2, err := name.ParseReference(host+"/tools/whoami:v2", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := mutate.Config(testImage(t), v1.Config{Env: []string{"PATH=/bin", "GREETING=v2"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(v2, changed); err != nil {
		t.Fatal(err)
	}
	// Replacing an image in use is safe: its sandboxes keep the root they
	// were made on; new sandboxes get the new image.
	if _, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: v2.String(), Name: "whoami", Insecure: true}, nil); err != nil {
		t.Fatalf("replacing an image in use: %v", err)
	}
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"whoami"}}); r.stdout != "hello-from-image /work 1000 1000\n" {
		t.Fatalf("the sandbox after its image was replaced: %+v", r)
	}
	sb2 := newSandbox(t, c, sdk.CreateSandboxRequest{Image: "whoami", MemoryMiB: 128})
	if r := run(t, c, sb2.ID, sdk.ExecRequest{Cmd: []string{"whoami"}}); r.stdout != "v2 / 0 0\n" { // v2 sets only Env: no WorkingDir, no User
		t.Fatalf("a sandbox of the replaced image: %+v", r)
	}
	if err := c.DeleteSandbox(t.Context(), sb2.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetImage(t.Context(), "whoami"); err != nil || len(got.UsedBy) != 1 {
		t.Fatalf("inspect: %+v %v", got, err)
	}
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteImage(t.Context(), "whoami"); err != nil {
		t.Fatalf("removing an unused image: %v", err)
	}
	if _, err := c.GetImage(t.Context(), "whoami"); !sdk.IsNotFound(err) {
		t.Fatalf("removed image still there: %v", err)
	}
	// Errors say what is wrong.
	if _, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: host + "/no/such:image", Insecure: true}, nil); !sdk.IsNotFound(err) {
		t.Fatalf("pull of a missing image: %v", err)
	}
	if _, err := c.PullImage(t.Context(), sdk.PullImageRequest{Ref: "Not A Ref!!"}, nil); !sdk.IsInvalidArgument(err) {
		t.Fatalf("pull of a bad ref: %v", err)
	}
}
