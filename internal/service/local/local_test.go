package local_test

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/clade-sandbox/clade/internal/engine/fake"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/local"
	"github.com/clade-sandbox/clade/internal/service/servicetest"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestConformance runs the service suite on the local implementation over
// a Manager on the fake engine (lifecycle, snapshots, sleep, events); the
// remote package's run covers exec, files and ports on real runsc.
func TestConformance(t *testing.T) {
	servicetest.Run(t, func(t *testing.T) servicetest.Env {
		return servicetest.Env{Service: newLocal(t), Image: "test"}
	})
}

func newLocal(t testing.TB) service.Service {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	imgs, err := image.NewStore(filepath.Join(dir, "images"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots"), SleepDir: filepath.Join(dir, "sleep"),
		MemoryFloorMiB: 1, PressureFloorMiB: -1} // the host's memory is not what this is about
	mgr := sandbox.New(cfg, fake.New(), st, imgs)
	t.Cleanup(func() { mgr.Close() })
	svc := local.New(local.Config{Version: "test"}, mgr)

	// A one-directory image is all the fake engine needs.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: os.Getuid(), Gid: os.Getgid()})
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layer.Bytes(), types.DockerUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("test:latest")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "image.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ImportImage(t.Context(), archive, service.ImportImage{Name: "test"}, nil); err != nil {
		t.Fatalf("import the test image: %v", err)
	}
	return svc
}
