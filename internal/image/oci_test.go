package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// testRegistry is go-containerregistry's in-process registry behind a
// handler that counts blob downloads, can require basic auth, and can hook
// blob requests.
type testRegistry struct {
	host      string
	user, pwd string
	blobGets  atomic.Int64
	onBlob    atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool] // true: handled
}

func newRegistry(t testing.TB, user, pwd string) *testRegistry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr := &testRegistry{user: user, pwd: pwd}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user != "" {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pwd {
				w.Header().Set("WWW-Authenticate", `Basic realm="clade-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			tr.blobGets.Add(1)
			if h := tr.onBlob.Load(); h != nil && (*h)(w, r) {
				return
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr
}

// push writes img to the registry as repo:tag and returns the reference.
func (tr *testRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := tr.host + "/" + repoTag
	if err := remote.Write(mustRef(t, ref), img, tr.auth()); err != nil {
		t.Fatal(err)
	}
	return ref
}

func mustRef(t testing.TB, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustTag(t testing.TB, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

func (tr *testRegistry) auth() remote.Option {
	if tr.user == "" {
		return remote.WithAuth(authn.Anonymous)
	}
	return remote.WithAuth(&authn.Basic{Username: tr.user, Password: tr.pwd})
}

// dockerConfig points authn.DefaultKeychain at a config holding auths
// (host -> "user:password"), so the host's own config never leaks in.
func dockerConfig(t *testing.T, auths map[string]string) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString(`{"auths":{`)
	i := 0
	for host, up := range auths {
		if i++; i > 1 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q:{%q:%q}", host, "auth", base64.StdEncoding.EncodeToString([]byte(up)))
	}
	b.WriteString("}}")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

func gzLayer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := layerTar(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func zstdLayer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := layerTar(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a linux/amd64 image of layers with config c.
func testImage(t testing.TB, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	return testImagePlatform(t, "amd64", c, layers...)
}

func testImagePlatform(t testing.TB, arch string, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, c
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// multiLayer is an image of four layers (gzip, zstd and uncompressed) with
// whiteouts, an opaque directory and a write through a symlinked parent.
func multiLayer(t testing.TB) (v1.Image, []string) {
	img := testImage(t, v1.Config{Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8"}, WorkingDir: "/app", User: "1000:1000",
		Entrypoint: []string{"/usr/bin/tini", "--"}, Cmd: []string{"python3"}},
		gzLayer(t, ent{name: "etc/"}, ent{name: "etc/os-release", body: "clade"}, ent{name: "etc/junk", body: "junk"},
			ent{name: "usr/bin/"}, ent{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
			ent{name: "var/cache/"}, ent{name: "var/cache/a", body: "a"}, ent{name: "var/cache/sub/"}, ent{name: "var/cache/sub/b", body: "b"}),
		zstdLayer(t, ent{name: "etc/.wh.junk"}, ent{name: "var/cache/.wh..wh..opq"}, ent{name: "var/cache/new", body: "new"}),
		static.NewLayer(layerTar(t, ent{name: "bin/tini", body: "tini", mode: 0o755}, ent{name: "app/"}), types.OCIUncompressedLayer),
		gzLayer(t, ent{name: "app/main.py", body: "print(42)"}),
	)
	return img, []string{
		".clade d", ".clade/bin d", ".clade/run d", // the engine's mount points (addMountPoints)
		"app d", "app/main.py f=print(42)",
		"bin l->usr/bin",
		"etc d", "etc/os-release f=clade",
		"usr d", "usr/bin d", "usr/bin/tini f=tini",
		"var d", "var/cache d", "var/cache/new f=new",
	}
}

// assertClean fails if the store holds leftovers of a build or removal, or
// images other than want.
func assertClean(t testing.TB, s *catalog, want ...string) {
	t.Helper()
	// The catalog removes replaced roots at once: the roots left are the
	// images'.
	roots, _ := os.ReadDir(filepath.Join(s.dir, rootfsDir))
	if len(roots) != len(want) {
		t.Errorf("%d image roots for images %v", len(roots), want)
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		switch n := e.Name(); {
		case n == blobsDir || n == gcLock || n == rootfsDir:
		default:
			t.Errorf("leftover %s", n)
		}
	}
	for n := range s.imgs {
		got = append(got, n)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("images %v, want %v", got, want)
	}
}

func blobs(t testing.TB, s *catalog) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(s.dir, blobsDir, "sha256"))
	var out []string
	for _, e := range ents {
		out = append(out, "sha256:"+e.Name())
	}
	return out
}

func layerDigests(t testing.TB, img v1.Image) []string {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}

func TestPullFlattens(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	img, want := multiLayer(t)
	ref := reg.push(t, "team/python:3.12-slim", img)
	s := newTestStore(t)

	got, err := s.Pull(t.Context(), ref, PullOptions{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "127.0.0.1-"+strings.Split(reg.host, ":")[1]+"-team-python-3.12-slim" {
		t.Errorf("name %q", got.Name)
	}
	if tr := tree(t, got.RootFS); !slices.Equal(tr, want) {
		t.Fatalf("rootfs:\n%s\nwant:\n%s", strings.Join(tr, "\n"), strings.Join(want, "\n"))
	}
	digest, _ := img.Digest()
	cfgName, _ := img.ConfigName()
	if got.ManifestDigest != digest.String() || got.ConfigDigest != cfgName.String() || got.Platform != "linux/amd64" ||
		!slices.Equal(got.Layers, layerDigests(t, img)) || got.Source != ref || got.SizeBytes == 0 {
		t.Errorf("image %+v", got)
	}
	wantCfg := Config{Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8"}, WorkingDir: "/app", User: "1000:1000",
		Entrypoint: []string{"/usr/bin/tini", "--"}, Cmd: []string{"python3"}}
	if fmt.Sprint(got.Config) != fmt.Sprint(wantCfg) {
		t.Errorf("config %+v, want %+v", got.Config, wantCfg)
	}
	// What Pull returns is what the store reads back.
	again, err := s.Get(t.Context(), got.Name)
	if err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
		t.Errorf("Get: %+v, %v\nPull: %+v", again, err, got)
	}
	if list, _ := s.List(t.Context()); len(list) != 1 || list[0].Name != got.Name {
		t.Errorf("List: %+v", list)
	}
	if b := blobs(t, s); !slices.Equal(b, sorted(got.Layers)) {
		t.Errorf("blobs %v, want %v", b, got.Layers)
	}
	assertClean(t, s, got.Name)
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

func TestPullAuth(t *testing.T) {
	reg := newRegistry(t, "alice", "s3cret")
	img, _ := multiLayer(t)
	ref := reg.push(t, "private/app:v1", img)
	s := newTestStore(t)

	for _, c := range []struct {
		name  string
		auths map[string]string
	}{{"no credentials", nil}, {"wrong password", map[string]string{reg.host: "alice:guess"}}} {
		t.Run(c.name, func(t *testing.T) {
			dockerConfig(t, c.auths)
			_, err := s.Pull(t.Context(), ref, PullOptions{Name: "app", Insecure: true})
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "docker login") {
				t.Fatalf("got %v (%s), want InvalidArgument saying to log in", err, errdefs.ClassOf(err))
			}
			assertClean(t, s)
		})
	}
	dockerConfig(t, map[string]string{reg.host: "alice:s3cret"})
	got, err := s.Pull(t.Context(), ref, PullOptions{Name: "app", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(got.RootFS, "app/main.py")); err != nil {
		t.Fatal(err)
	}
}

func TestPullErrors(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	img, _ := multiLayer(t)
	reg.push(t, "app:v1", img)
	arm := reg.host + "/arm:v1"
	if err := remote.Write(mustRef(t, arm), testImagePlatform(t, "arm64", v1.Config{}, gzLayer(t, ent{name: "a", body: "a"}))); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t)
	for _, c := range []struct {
		ref   string
		opts  PullOptions
		class errdefs.Class
	}{
		{reg.host + "/app:nope", PullOptions{}, errdefs.NotFound},
		{reg.host + "/nope:v1", PullOptions{}, errdefs.NotFound},
		{"UPPER/case", PullOptions{}, errdefs.InvalidArgument},
		{reg.host + "/app:v1", PullOptions{Name: "Bad Name"}, errdefs.InvalidArgument},
		{reg.host + "/app:v1", PullOptions{Name: "blobs"}, errdefs.InvalidArgument},
		{reg.host + "/app:v1", PullOptions{Platform: "linux/"}, errdefs.InvalidArgument},
		{arm, PullOptions{}, errdefs.InvalidArgument}, // single-platform arm64 image
		{"127.0.0.1:1/app:v1", PullOptions{}, errdefs.Unavailable},
	} {
		t.Run(c.ref, func(t *testing.T) {
			_, err := s.Pull(t.Context(), c.ref, c.opts)
			if errdefs.ClassOf(err) != c.class {
				t.Fatalf("got %v (%s), want %s", err, errdefs.ClassOf(err), c.class)
			}
			t.Log(err)
		})
	}
	assertClean(t, s)
}

func TestPullPlatform(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	amd := testImagePlatform(t, "amd64", v1.Config{}, gzLayer(t, ent{name: "arch", body: "amd64"}))
	arm := testImagePlatform(t, "arm64", v1.Config{}, gzLayer(t, ent{name: "arch", body: "arm64"}))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	ref := reg.host + "/multi:v1"
	if err := remote.WriteIndex(mustRef(t, ref), idx); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t)
	for plat, want := range map[string]string{"": "amd64", "linux/arm64": "arm64"} {
		img, err := s.Pull(t.Context(), ref, PullOptions{Name: "multi-" + want, Platform: plat})
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(img.RootFS, "arch")); string(b) != want || img.Platform != "linux/"+want {
			t.Errorf("platform %q: got %q, %s", plat, b, img.Platform)
		}
	}
	_, err := s.Pull(t.Context(), ref, PullOptions{Name: "s390x", Platform: "linux/s390x"})
	if !errdefs.IsNotFound(err) {
		t.Errorf("missing platform: %v (%s)", err, errdefs.ClassOf(err))
	}
}

func TestPullTwiceAndReplace(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	img, _ := multiLayer(t)
	ref := reg.push(t, "app:v1", img)
	s := newTestStore(t)

	start := time.Now()
	first, err := s.Pull(t.Context(), ref, PullOptions{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	tFirst := time.Since(start)
	if n := reg.blobGets.Load(); n != 5 { // 4 layers and the config
		t.Errorf("first pull: %d blob downloads, want 5", n)
	}

	reg.blobGets.Store(0)
	var last Progress
	start = time.Now()
	second, err := s.Pull(t.Context(), ref, PullOptions{Name: "app", Progress: func(p Progress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	tSecond := time.Since(start)
	t.Logf("pull of 4 layers from the local registry: first %v, second %v", tFirst, tSecond)
	if n := reg.blobGets.Load(); n != 0 {
		t.Errorf("second pull: %d blob downloads, want 0", n)
	}
	if !second.CreatedAt.Equal(first.CreatedAt) {
		t.Error("second pull rebuilt the image")
	}
	if last.Cached != 4 || last.LayersDone != 4 || last.BytesDone != last.BytesTotal {
		t.Errorf("second pull progress %+v", last)
	}

	// The tag moves to an image sharing three layers: only the new layer
	// and the config download, and the old top layer's blob goes.
	ls, _ := img.Layers()
	v2 := testImage(t, v1.Config{Cmd: []string{"v2"}}, append(ls[:3], gzLayer(t, ent{name: "app/main.py", body: "print(43)"}))...)
	reg.push(t, "app:v1", v2)
	reg.blobGets.Store(0)
	third, err := s.Pull(t.Context(), ref, PullOptions{Name: "app", Progress: func(p Progress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	if n := reg.blobGets.Load(); n != 2 || last.Cached != 3 {
		t.Errorf("pull of the moved tag: %d blob downloads, %d cached; want 2 and 3", n, last.Cached)
	}
	if b, _ := os.ReadFile(filepath.Join(third.RootFS, "app/main.py")); string(b) != "print(43)" || third.ManifestDigest == first.ManifestDigest {
		t.Errorf("replaced image: %q, %s", b, third.ManifestDigest)
	}
	if b := blobs(t, s); !slices.Equal(b, sorted(third.Layers)) {
		t.Errorf("blobs %v, want %v", b, sorted(third.Layers))
	}
	assertClean(t, s, "app")
}

func TestSharedLayersAndRemove(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	base := gzLayer(t, ent{name: "etc/"}, ent{name: "etc/os-release", body: "shared"})
	a := testImage(t, v1.Config{}, base, gzLayer(t, ent{name: "a", body: "a"}))
	b := testImage(t, v1.Config{}, base, gzLayer(t, ent{name: "b", body: "b"}))
	refA, refB := reg.push(t, "a:1", a), reg.push(t, "b:1", b)
	s := newTestStore(t)

	imgA, err := s.Pull(t.Context(), refA, PullOptions{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	reg.blobGets.Store(0)
	var last Progress
	imgB, err := s.Pull(t.Context(), refB, PullOptions{Name: "b", Progress: func(p Progress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	if n := reg.blobGets.Load(); n != 2 || last.Cached != 1 { // own layer and config
		t.Errorf("second image: %d blob downloads, %d cached; want 2 and 1", n, last.Cached)
	}
	for _, img := range []Image{imgA, imgB} {
		if b, _ := os.ReadFile(filepath.Join(img.RootFS, "etc/os-release")); string(b) != "shared" {
			t.Errorf("%s: shared layer missing", img.Name)
		}
	}
	if len(blobs(t, s)) != 3 {
		t.Errorf("blobs %v, want 3", blobs(t, s))
	}

	if err := s.Remove(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := blobs(t, s); !slices.Equal(got, sorted(imgB.Layers)) {
		t.Errorf("after removing a: blobs %v, want b's %v", got, imgB.Layers)
	}
	if _, err := s.Get(t.Context(), "a"); err == nil {
		t.Error("a still there")
	}
	if err := s.Remove(t.Context(), "a"); !errdefs.IsNotFound(err) {
		t.Errorf("second remove: %v, want NotFound", err)
	}
	if err := s.Remove(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if got := blobs(t, s); len(got) != 0 {
		t.Errorf("after removing all: blobs %v", got)
	}
	assertClean(t, s)
}

func TestPullProgress(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7 % 251)
	}
	img, _ := multiLayer(t)
	ls, _ := img.Layers()
	img = testImage(t, v1.Config{}, append(ls, gzLayer(t, ent{name: "big", body: string(big)}))...)
	ref := reg.push(t, "app:v1", img)
	m, _ := img.Manifest()
	var total int64
	for _, l := range m.Layers {
		total += l.Size
	}

	var seen []Progress
	if _, err := newTestStore(t).Pull(t.Context(), ref, PullOptions{Progress: func(p Progress) { seen = append(seen, p) }}); err != nil {
		t.Fatal(err)
	}
	// One at the start, one per layer and one at the end, at least.
	if len(seen) < len(m.Layers)+2 || seen[0].BytesDone != 0 || seen[0].LayersDone != 0 {
		t.Fatalf("%d progress calls for %d layers", len(seen), len(m.Layers))
	}
	layers := map[string]bool{}
	for _, l := range m.Layers {
		layers[l.Digest.String()] = true
	}
	var prev Progress
	for i, p := range seen {
		if p.BytesTotal != total || p.LayersTotal != len(m.Layers) || p.BytesDone < prev.BytesDone || p.BytesDone > total ||
			p.LayersDone < prev.LayersDone || p.LayersDone > p.LayersTotal || (i > 0 && !layers[p.Layer]) {
			t.Fatalf("progress %d: %+v after %+v (total %d)", i, p, prev, total)
		}
		prev = p
	}
	if prev.BytesDone != total || prev.LayersDone != len(m.Layers) || prev.Cached != 0 {
		t.Errorf("last progress %+v", prev)
	}
}

func TestPullInterrupted(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	img, _ := multiLayer(t)
	ref := reg.push(t, "app:v1", img)
	third := layerDigests(t, img)[2]
	ls, _ := img.Layers()
	rc, _ := ls[2].Compressed()
	blob, _ := io.ReadAll(rc)
	s := newTestStore(t)

	// Block the third layer's download half way until the pull gives up.
	started := make(chan struct{})
	hook := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, third) {
			return false
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.WriteHeader(http.StatusOK)
		w.Write(blob[:len(blob)/2])
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		return true
	}
	reg.onBlob.Store(&hook)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := s.Pull(ctx, ref, PullOptions{Name: "app"})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("pull ended before the blocked layer: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if _, err := s.Get(t.Context(), "app"); err == nil {
		t.Error("interrupted pull left an image")
	}
	assertClean(t, s)
	// Blobs it finished stay for the retry, which downloads only the rest.
	if got := blobs(t, s); len(got) != 2 {
		t.Errorf("blobs after interrupt: %v", got)
	}
	reg.onBlob.Store(nil)
	reg.blobGets.Store(0)
	if _, err := s.Pull(t.Context(), ref, PullOptions{Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if n := reg.blobGets.Load(); n != 3 {
		t.Errorf("retry: %d blob downloads, want 3 (2 layers and the config)", n)
	}
}

func TestPullHostileLayer(t *testing.T) {
	dockerConfig(t, nil)
	reg := newRegistry(t, "", "")
	img := testImage(t, v1.Config{}, gzLayer(t, ent{name: "ok", body: "ok"}),
		gzLayer(t, ent{name: "l", typ: tar.TypeSymlink, link: "../../../.."}, ent{name: "l/etc/evil", body: "x"}))
	ref := reg.push(t, "evil:v1", img)
	s := newTestStore(t)
	_, err := s.Pull(t.Context(), ref, PullOptions{Name: "evil"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("got %v (%s), want InvalidArgument", err, errdefs.ClassOf(err))
	}
	t.Log(err)
	assertClean(t, s)
}

func TestImportDockerSave(t *testing.T) {
	img, want := multiLayer(t)
	dir := t.TempDir()

	t.Run("compressed", func(t *testing.T) {
		p := filepath.Join(dir, "app.tar")
		if err := tarball.WriteToFile(p, mustTag(t, "example.com/team/app:v1"), img); err != nil {
			t.Fatal(err)
		}
		s := newTestStore(t)
		var last Progress
		got, err := s.Import(t.Context(), p, ImportOptions{Progress: func(pr Progress) { last = pr }})
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "example.com-team-app-v1" || got.Source != p || got.Config.WorkingDir != "/app" || got.Ref != "example.com/team/app:v1" {
			t.Errorf("image %+v", got)
		}
		// Uploaded to a temporary file, the source is what the client named.
		again, err := s.Import(t.Context(), p, ImportOptions{Name: "again", Source: "/home/me/app.tar"})
		if err != nil || again.Source != "/home/me/app.tar" {
			t.Errorf("import with a source: %+v %v", again, err)
		}
		// A client's file name is shown back: control characters are refused.
		if _, err := s.Import(t.Context(), p, ImportOptions{Name: "evil", Source: "evil\x1b]0;pwned\x07.tar"}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("a source with control characters: %v", err)
		}
		if err := s.Remove(t.Context(), "again"); err != nil {
			t.Fatal(err)
		}
		if tr := tree(t, got.RootFS); !slices.Equal(tr, want) {
			t.Fatalf("rootfs:\n%s", strings.Join(tr, "\n"))
		}
		// The blobs are the registry's, so a later pull shares them.
		if !slices.Equal(got.Layers, layerDigests(t, img)) {
			t.Errorf("layers %v, want %v", got.Layers, layerDigests(t, img))
		}
		if last.LayersDone != 4 || last.BytesDone != last.BytesTotal || last.BytesTotal == 0 {
			t.Errorf("progress %+v", last)
		}
		assertClean(t, s, got.Name)
	})

	t.Run("uncompressed like docker save", func(t *testing.T) {
		raw := testImage(t, v1.Config{Cmd: []string{"sh"}},
			static.NewLayer(layerTar(t, ent{name: "etc/"}, ent{name: "etc/junk", body: "j"}), types.DockerUncompressedLayer),
			static.NewLayer(layerTar(t, ent{name: "etc/.wh.junk"}, ent{name: "etc/hostname", body: "h"}), types.DockerUncompressedLayer))
		p := filepath.Join(dir, "raw.tar")
		if err := tarball.WriteToFile(p, mustTag(t, "raw:latest"), raw); err != nil {
			t.Fatal(err)
		}
		got, err := newTestStore(t).Import(t.Context(), p, ImportOptions{Name: "mine"})
		if err != nil {
			t.Fatal(err)
		}
		if tr := tree(t, got.RootFS); got.Name != "mine" || !slices.Equal(tr, []string{".clade d", ".clade/bin d", ".clade/run d", "etc d", "etc/hostname f=h"}) {
			t.Errorf("%s: %v", got.Name, tr)
		}
	})

	t.Run("several images: the first", func(t *testing.T) {
		other := testImage(t, v1.Config{}, gzLayer(t, ent{name: "other", body: "o"}))
		p := filepath.Join(dir, "multi.tar")
		err := tarball.MultiWriteToFile(p, map[name.Tag]v1.Image{mustTag(t, "zz:1"): other, mustTag(t, "aa:1"): img})
		if err != nil {
			t.Fatal(err)
		}
		got, err := newTestStore(t).Import(t.Context(), p, ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "aa-1" || !slices.Equal(tree(t, got.RootFS), want) {
			t.Errorf("imported %s", got.Name)
		}
	})
}

func TestImportLayout(t *testing.T) {
	img, want := multiLayer(t)
	dir := filepath.Join(t.TempDir(), "app-layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v2"})); err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()

	t.Run("dir", func(t *testing.T) {
		s := newTestStore(t)
		got, err := s.Import(t.Context(), dir, ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "app-layout-v2" || got.ManifestDigest != digest.String() || !slices.Equal(tree(t, got.RootFS), want) {
			t.Errorf("image %+v: %v", got, tree(t, got.RootFS))
		}
		assertClean(t, s, got.Name)
	})

	t.Run("tar", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "layout.tar")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := tarx.Create(f, dir, "."); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s := newTestStore(t)
		// A pulled copy of the image shares its blobs with the import.
		got, err := s.Import(t.Context(), p, ImportOptions{Name: "from-tar"})
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "from-tar" || !slices.Equal(tree(t, got.RootFS), want) {
			t.Errorf("image %+v", got)
		}
		assertClean(t, s, got.Name)
	})

	// A layout's reader refuses a blob that is a symlink but follows
	// index.json and the directories above the blobs: a tar whose blobs/
	// is a link to a host directory would read the host's blobs (another
	// client's images, by digest) into this one.
	t.Run("tar with a symlink", func(t *testing.T) {
		host, cp := t.TempDir(), filepath.Join(t.TempDir(), "layout")
		if err := os.CopyFS(cp, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(cp, "blobs"), filepath.Join(host, "blobs")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(host, "blobs"), filepath.Join(cp, "blobs")); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "layout.tar")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := tarx.Create(f, cp, "."); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s := newTestStore(t)
		if got, err := s.Import(t.Context(), p, ImportOptions{Name: "linked"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "symlink") {
			t.Fatalf("import of a layout tar with a symlinked blobs/: %+v, %v; want an InvalidArgument error naming the symlink", got, err)
		}
		assertClean(t, s)
	})

	t.Run("containerd name", func(t *testing.T) {
		dir := t.TempDir()
		lp, _ := layout.Write(dir, empty.Index)
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "docker.io/library/alpine:3.20"})); err != nil {
			t.Fatal(err)
		}
		got, err := newTestStore(t).Import(t.Context(), dir, ImportOptions{})
		if err != nil || got.Name != "alpine-3.20" {
			t.Errorf("%+v, %v", got, err)
		}
	})

	t.Run("not an image", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "junk.tar")
		os.WriteFile(p, layerTar(t, ent{name: "hello", body: "x"}), 0o644)
		s := newTestStore(t)
		for path, class := range map[string]errdefs.Class{p: errdefs.InvalidArgument, p + ".missing": errdefs.NotFound, t.TempDir(): errdefs.InvalidArgument} {
			if _, err := s.Import(t.Context(), path, ImportOptions{Name: "x"}); errdefs.ClassOf(err) != class {
				t.Errorf("%s: %v, want %s", path, err, class)
			}
		}
		assertClean(t, s)
	})
}

func TestNewStoreCleansLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{".build-app-0123", ".build-live-4567", ".rm-old-89ab", ".build-default", "blobs/sha256"} {
		if err := os.MkdirAll(filepath.Join(dir, d, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "blobs/sha256", strings.Repeat("a", 64)), []byte("orphan"), 0o644)
	// Another process's live build holds its lock.
	live, err := os.Open(filepath.Join(dir, ".build-live-4567"))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := unix.Flock(int(live.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(dir, nil); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	// .build-default is EnsureDefault's, under its own lock.
	if want := []string{".build-default", ".build-live-4567", "blobs"}; !slices.Equal(got, want) {
		t.Errorf("after NewStore: %v, want %v", got, want)
	}
	// Blobs are the daemon's to collect: only its store knows which images
	// use them.
	if b, _ := os.ReadDir(filepath.Join(dir, "blobs/sha256")); len(b) != 2 {
		t.Errorf("blobs after NewStore: %v", b)
	}
}

func TestDefaultName(t *testing.T) {
	for ref, want := range map[string]string{
		"python:3.12-slim":                          "python-3.12-slim",
		"python":                                    "python",
		"python:latest":                             "python",
		"docker.io/library/python:3.12":             "python-3.12",
		"bitnami/redis:7.2":                         "bitnami-redis-7.2",
		"ghcr.io/Org/App:V1":                        "",
		"ghcr.io/org/app:V1":                        "ghcr.io-org-app-v1",
		"localhost:5000/a/b/c:dev":                  "localhost-5000-a-b-c-dev",
		"alpine@sha256:" + strings.Repeat("ab", 32): "alpine-abababababab",
		"": "",
		"registry.example.com/" + strings.Repeat("x", 80) + ":1": "registry.example.com-" + strings.Repeat("x", 43),
	} {
		got := DefaultName(ref)
		if got != want || (got != "" && !ValidName(got)) {
			t.Errorf("DefaultName(%q) = %q, want %q", ref, got, want)
		}
	}
}

// benchImage is a three-layer image of about 1500 files and 6 MiB.
func benchImage(b *testing.B) v1.Image {
	var layers []v1.Layer
	for l := range 3 {
		ents := []ent{{name: fmt.Sprintf("l%d/", l)}}
		for i := range 500 {
			ents = append(ents, ent{name: fmt.Sprintf("l%d/f%d", l, i), body: strings.Repeat(fmt.Sprint(i), 1000)})
		}
		big := make([]byte, 2<<20)
		for i := range big {
			big[i] = byte(i*131 + l)
		}
		ents = append(ents, ent{name: fmt.Sprintf("l%d/big", l), body: string(big)})
		layers = append(layers, gzLayer(b, ents...))
	}
	return testImage(b, v1.Config{}, layers...)
}

// BenchmarkPull pulls a small multi-layer image from the in-process
// registry into a fresh store (first) and again into the same (second).
func BenchmarkPull(b *testing.B) {
	b.Setenv("DOCKER_CONFIG", b.TempDir())
	reg := newRegistry(b, "", "")
	ref := reg.push(b, "bench:v1", benchImage(b))
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			s := newTestStore(b)
			b.StartTimer()
			if _, err := s.Pull(b.Context(), ref, PullOptions{Name: "bench"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("second", func(b *testing.B) {
		s := newTestStore(b)
		if _, err := s.Pull(b.Context(), ref, PullOptions{Name: "bench"}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := s.Pull(b.Context(), ref, PullOptions{Name: "bench"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
