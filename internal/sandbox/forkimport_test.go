package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine/fake"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/clade-sandbox/clade/internal/store"
)

// copyImage copies the sealed image in src to dir (not existing), with
// corrupt applied to its data file's bytes: what a peer sends.
func copyImage(t *testing.T, src, dir string, corrupt func([]byte)) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() != stateimg.ManifestName {
			corrupt(b)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPorterImport exports a running sandbox's snapshot from one node and
// imports it on another (its own store, engine and snapshot dir, the same
// image): an image with a byte flipped in transit is refused by the
// verification and leaves nothing on the target; an intact one restores
// the children, whose implicit snapshot goes with the last of them; a
// node without the same image root refuses before fetching.
func TestPorterImport(t *testing.T) {
	a := newEnv(t, Config{})
	parent := a.create(t, 64)
	owner := NewPorter(a.m)
	if _, _, err := owner.Export(t.Context(), parent.ID, a.m.cfg.MaxFork+1); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("export for more children than --max-fork: %v", err)
	}
	e, release, err := owner.Export(t.Context(), parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if e.Local != "" || e.ImageID == "" || e.Digest == "" {
		t.Fatalf("export %+v", e)
	}
	src, done, err := owner.Open(e.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if _, _, err := owner.Open("sha256:00"); !errdefs.IsNotFound(err) {
		t.Fatalf("open of an image not being sent: %v", err)
	}

	dir := t.TempDir()
	stB, err := store.Open(t.Context(), filepath.Join(dir, "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer stB.Close()
	cfgB := Config{SnapshotDir: filepath.Join(dir, "snapshots"), SleepDir: filepath.Join(dir, "sleep"), MemoryFloorMiB: 1, PressureFloorMiB: -1}
	b := New(cfgB, fake.New(), stB, a.imgs)
	img, err := a.m.images.Get(t.Context(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.images.install(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	target := NewPorter(b)
	empty := func(what string) {
		t.Helper()
		if sns, _ := stB.ListSnapshots(t.Context()); len(sns) != 0 {
			t.Fatalf("%s: the target records snapshots %+v", what, sns)
		}
		if sbs, _ := stB.ListSandboxes(t.Context()); len(sbs) != 0 {
			t.Fatalf("%s: the target records sandboxes %+v", what, sbs)
		}
		if ents, _ := os.ReadDir(cfgB.SnapshotDir); len(ents) != 0 {
			t.Fatalf("%s: the target keeps %v in its snapshot dir", what, ents)
		}
	}

	// B holds the image's root: it never fetches one.
	noRoot := func(ctx context.Context, id string) (io.ReadCloser, error) {
		t.Fatalf("a node with the image's root fetched root %s", id)
		return nil, nil
	}
	fetched := 0
	_, err = target.Import(t.Context(), e, 2, func(ctx context.Context, dir string) error {
		fetched++
		copyImage(t, src, dir, func(b []byte) { b[len(b)/2] ^= 1 })
		return nil
	}, noRoot)
	if !errors.Is(err, stateimg.ErrCorrupt) || fetched != 1 {
		t.Fatalf("import of a corrupted image: %v (fetched %d), want corrupt", err, fetched)
	}
	t.Logf("corrupt: %v", err)
	empty("after a corrupt import")

	// Another root of the image, which no node can send: refused before
	// the snapshot is fetched.
	other := e
	other.ImageID = RootID(image.Image{Name: testImage, Source: "elsewhere"})
	if _, err := target.Import(t.Context(), other, 1, func(ctx context.Context, dir string) error {
		t.Fatal("fetched for a node without the image root")
		return nil
	}, func(ctx context.Context, id string) (io.ReadCloser, error) {
		return nil, errdefs.New(errdefs.NotFound, "no node holds root %s", id)
	}); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no node holds root") {
		t.Fatalf("import on another image root: %v, want not found", err)
	}
	other.ImageID = "sha256:00"
	if _, err := target.Import(t.Context(), other, 1, func(ctx context.Context, dir string) error {
		t.Fatal("fetched for a bad root identity")
		return nil
	}, noRoot); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("import naming a bad root identity: %v, want invalid", err)
	}

	// A peer's snapshot that names volumes or secrets would mount this
	// node's: refused before a fetch.
	for _, o := range []string{`{"volumes":[{"name":"v","path":"/data"}]}`, `{"secrets":[{"name":"s"}]}`} {
		smuggled := e
		smuggled.Opts = json.RawMessage(o)
		if _, err := target.Import(t.Context(), smuggled, 1, func(ctx context.Context, dir string) error {
			t.Fatal("fetched a snapshot with volumes or secrets")
			return nil
		}, noRoot); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("import of %s: %v, want invalid", o, err)
		}
	}
	empty("after imports with volumes or secrets")

	// A reserve (a cluster's importing records) that fails ends the
	// import before anything is fetched.
	if _, err := target.ImportAs(t.Context(), e, 2, func(ctx context.Context, dir string) error {
		t.Fatal("fetched after the reserve failed")
		return nil
	}, noRoot, func(ids []string) error {
		return errdefs.New(errdefs.Unavailable, "no directory")
	}); !errdefs.IsUnavailable(err) {
		t.Fatalf("import whose reserve failed: %v, want its error", err)
	}
	empty("after an import whose reserve failed")

	// The children's ids are picked, and reserved, before the fetch;
	// they are the ids the children get.
	var reserved []string
	res, err := target.ImportAs(t.Context(), e, 2, func(ctx context.Context, dir string) error {
		if len(reserved) != 2 {
			t.Errorf("fetched with %d ids reserved, want 2 first", len(reserved))
		}
		copyImage(t, src, dir, func([]byte) {})
		return nil
	}, noRoot, func(ids []string) error {
		reserved = ids
		return nil
	})
	if err != nil || len(res.Children) != 2 || res.Children[0].Err != nil || res.Children[1].Err != nil {
		t.Fatalf("import: %+v %v", res, err)
	}
	if res.Children[0].ID != reserved[0] || res.Children[1].ID != reserved[1] {
		t.Fatalf("children %s and %s, reserved %v", res.Children[0].ID, res.Children[1].ID, reserved)
	}
	sn, err := stB.GetSnapshot(t.Context(), e.ID)
	if err != nil || !sn.Implicit || sn.State != store.SnapshotReady {
		t.Fatalf("imported snapshot %+v %v", sn, err)
	}
	for _, c := range res.Children {
		if err := b.Destroy(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
	empty("after the children are removed")
}

// TestExportedSnapshotKept: a named snapshot a fork across nodes is
// sending (exported, not yet released) is not removed under it: the rm
// is a Conflict that says why, and goes through once the fork is done.
func TestExportedSnapshotKept(t *testing.T) {
	a := newEnv(t, Config{})
	parent := a.create(t, 64)
	sn, err := a.m.Snapshot(t.Context(), parent.ID, "base", false)
	if err != nil {
		t.Fatal(err)
	}
	e, release, err := NewPorter(a.m).Export(t.Context(), "base", 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.m.DeleteSnapshot(t.Context(), "base"); !errdefs.Is(err, errdefs.Conflict) {
		release()
		t.Fatalf("rm of a snapshot being sent to other nodes: %v, want Conflict", err)
	}
	if dir, done, err := NewPorter(a.m).Open(e.Digest); err != nil {
		t.Fatalf("the image, after the refused rm: %v", err)
	} else if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the image's files, after the refused rm: %v", err)
	} else {
		done()
	}
	release()
	if err := a.m.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatalf("rm once the fork is done: %v", err)
	}
}

// TestPorterImportShipsRoot: a node without the snapshot's image (its own
// image directory) and a node with another root of the image's name each
// fetch the owner's root once (SendRoot's stream), verified, and restore
// the children on it; the second node's own image stays as it was; a child
// exported onward names the same root; the shipped root goes with the
// last child, and a restarted node knows its shipped roots.
func TestPorterImportShipsRoot(t *testing.T) {
	a := newEnv(t, Config{})
	aImg, err := a.m.images.Get(t.Context(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(aImg.RootFS, "etc", "marker"), []byte("from a"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent := a.create(t, 64)
	owner := NewPorter(a.m)
	e, release, err := owner.Export(t.Context(), parent.ID, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if e.ImageID != RootID(aImg) {
		t.Fatalf("export names root %s, the image's is %s", e.ImageID, RootID(aImg))
	}
	src, done, err := owner.Open(e.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	fetchSnap := func(ctx context.Context, dir string) error {
		copyImage(t, src, dir, func([]byte) {})
		return nil
	}
	roots := 0
	fromA := func(ctx context.Context, id string) (io.ReadCloser, error) {
		roots++
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(owner.SendRoot(ctx, id, func() io.Writer { return pw }))
		}()
		return pr, nil
	}
	node := func(name string, img *image.Image) (*Manager, store.All, *image.Store) {
		return shipNode(t, name, img, Config{})
	}
	var dImg image.Image
	c, stC, filesC := node("c", nil)
	d, _, _ := node("d", &dImg)
	if RootID(dImg) == e.ImageID {
		t.Fatal("d's image has a's root identity")
	}

	// A node that sends another root than the one asked for (d's): refused
	// before the snapshot is fetched, nothing of it kept.
	_, err = NewPorter(c).Import(t.Context(), e, 1, func(ctx context.Context, dir string) error {
		t.Fatal("fetched the snapshot after a bad root")
		return nil
	}, func(ctx context.Context, id string) (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(NewPorter(d).SendRoot(ctx, RootID(dImg), func() io.Writer { return pw }))
		}()
		return pr, nil
	})
	if !errdefs.IsInvalidArgument(err) || !errors.Is(err, image.ErrRootStream) || !strings.Contains(err.Error(), "asked for root") {
		t.Fatalf("import with another root sent: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(filesC.Dir(), ".rootfs")); len(ents) != 0 {
		t.Fatalf("c keeps roots %v after a refused one", ents)
	}
	if sbs, _ := stC.ListSandboxes(t.Context()); len(sbs) != 0 {
		t.Fatalf("c records sandboxes %+v after a refused root", sbs)
	}
	for _, tc := range []struct {
		m     *Manager
		name  string
		wantN int
	}{{c, "c", 2}, {d, "d", 1}} {
		before := roots
		res, err := NewPorter(tc.m).Import(t.Context(), e, tc.wantN, fetchSnap, fromA)
		if err != nil || len(res.Children) != tc.wantN {
			t.Fatalf("%s: import: %+v %v", tc.name, res, err)
		}
		if roots != before+1 {
			t.Fatalf("%s: fetched %d roots, want 1", tc.name, roots-before)
		}
		for _, ch := range res.Children {
			if ch.Err != nil {
				t.Fatalf("%s: child: %v", tc.name, ch.Err)
			}
			rec, err := tc.m.store.GetSandbox(t.Context(), ch.ID)
			if err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(rec.RootFS, "etc", "marker")); err != nil || string(b) != "from a" {
				t.Fatalf("%s: child %s stands on %s with marker %q (%v), want a's root", tc.name, ch.ID, rec.RootFS, b, err)
			}
			if rec.RootFS == aImg.RootFS {
				t.Fatalf("%s: child stands on a's own directory", tc.name)
			}
		}
	}
	// d's own image is untouched: its name still names d's root.
	if img, err := d.images.Get(t.Context(), testImage); err != nil || img.RootFS != dImg.RootFS {
		t.Fatalf("d's image after the import: %+v %v", img, err)
	}
	// A second import onto c uses the root shipped there: no fetch.
	before := roots
	res2, err := NewPorter(c).Import(t.Context(), e, 1, fetchSnap, fromA)
	if err != nil || roots != before {
		t.Fatalf("second import on c: %v, fetched %d roots", err, roots-before)
	}
	// A child on c, exported onward, names the same root.
	e2, release2, err := NewPorter(c).Export(t.Context(), res2.Children[0].ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e2.Local != "" || e2.ImageID != e.ImageID {
		t.Fatalf("export from c: root %s (local %q), want %s", e2.ImageID, e2.Local, e.ImageID)
	}
	release2()

	// A restart of c knows its shipped root.
	shipped := func(m *Manager) string {
		m.images.rootMu.Lock()
		defer m.images.rootMu.Unlock()
		return m.images.shipped[e.ImageID].RootFS
	}
	rootC := shipped(c)
	if rootC == "" {
		t.Fatal("c records no shipped root")
	}
	c2 := New(c.cfg, fake.New(), stC, filesC)
	if _, err := c2.images.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := shipped(c2); got != rootC {
		t.Fatalf("restarted c: shipped root %q, want %q", got, rootC)
	}
	sbs, err := stC.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if err := c.Destroy(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(rootC); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the shipped root after its last user went: %v", err)
	}
	if ents, _ := os.ReadDir(c.images.shipDir); len(ents) != 0 {
		t.Fatalf("files of shipped roots left: %v", ents)
	}
}

// shipNode makes a node of its own (store, image directory, state dir)
// with cfg; with img, an image testImage of its own build (its
// etc/marker says "from NAME"), returned in *img.
func shipNode(t *testing.T, name string, img *image.Image, cfg Config) (*Manager, store.All, *image.Store) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, name+".db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	files, err := image.NewStore(filepath.Join(dir, "images"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SnapshotDir, cfg.SleepDir = filepath.Join(dir, "state", "snapshots"), filepath.Join(dir, "state", "sleep")
	cfg.MemoryFloorMiB, cfg.PressureFloorMiB = 1, -1
	for _, d := range []string{cfg.SnapshotDir, cfg.SleepDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	m := New(cfg, fake.New(), st, files)
	if img != nil {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: os.Getuid(), Gid: os.Getgid()})
		_ = tw.WriteHeader(&tar.Header{Name: "etc/marker", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len("from " + name)), Uid: os.Getuid(), Gid: os.Getgid()})
		_, _ = tw.Write([]byte("from " + name))
		tw.Close()
		own, err := files.InstallTar(t.Context(), image.Image{Name: testImage}, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if *img, err = m.images.install(t.Context(), own); err != nil {
			t.Fatal(err)
		}
	}
	return m, st, files
}

// rootFrom is a RootFetch from p's node that counts its calls.
func rootFrom(p *Porter, calls *int) RootFetch {
	return func(ctx context.Context, id string) (io.ReadCloser, error) {
		*calls++
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(p.SendRoot(ctx, id, func() io.Writer { return pw })) }()
		return pr, nil
	}
}

// TestAdoptOnItsRoot: a sandbox slept on a (its sleep image in a shared
// snapshot store) is adopted by d, which has another build of the image's
// name: d never wakes it on its own build. With no node to fetch the root
// from, the adopt is refused (Unavailable, saying so) and leaves nothing;
// with a's root fetched, the sandbox is recorded asleep on it, and d's own
// image stays d's.
func TestAdoptOnItsRoot(t *testing.T) {
	objects, err := snapstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	copies := func() *snapstore.Copies {
		c, err := snapstore.NewCopies(objects, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	var aImg, dImg image.Image
	a, _, _ := shipNode(t, "a", &aImg, Config{Copies: copies()})
	d, stD, _ := shipNode(t, "d", &dImg, Config{Copies: copies()})
	sb, err := a.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.cfg.Copies.Wait(t.Context(), sleepCopy(sb.ID)); err != nil {
		t.Fatal(err)
	}
	digest, err := NewMover(a).SleepImage(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	nobody := func(ctx context.Context, id string) (io.ReadCloser, error) {
		return nil, errdefs.New(errdefs.Unavailable, "no live node holds image root %.19s", id)
	}
	if _, err := NewMover(d).Adopt(t.Context(), sb.ID, string(digest), nobody); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "no live node holds") {
		t.Fatalf("adopt with the root nowhere: %v, want unavailable", err)
	}
	if _, err := stD.GetSandbox(t.Context(), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("d records the sandbox after a refused adopt: %v", err)
	}
	if ents, _ := os.ReadDir(d.cfg.SleepDir); len(ents) != 0 {
		t.Fatalf("d's sleep dir after a refused adopt: %v", ents)
	}
	calls := 0
	rec, err := NewMover(d).Adopt(t.Context(), sb.ID, string(digest), rootFrom(NewPorter(a), &calls))
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || rec.State != store.StateSleeping || rec.RootFS == dImg.RootFS {
		t.Fatalf("adopted %+v with %d root fetches, d's own root %s", rec, calls, dImg.RootFS)
	}
	if b, err := os.ReadFile(filepath.Join(rec.RootFS, "etc", "marker")); err != nil || string(b) != "from a" {
		t.Fatalf("the adopted sandbox stands on %s: marker %q %v, want a's root", rec.RootFS, b, err)
	}
	if img, err := d.images.Get(t.Context(), testImage); err != nil || img.RootFS != dImg.RootFS {
		t.Fatalf("d's image after the adopt: %+v %v", img, err)
	}
	// It wakes there, on that root.
	if _, err := d.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := stD.GetSandbox(t.Context(), sb.ID); err != nil || got.State != store.StateRunning || got.RootFS != rec.RootFS {
		t.Fatalf("woken on d: %+v %v", got, err)
	}
}
