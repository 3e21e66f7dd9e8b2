package store

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

func openTest(t *testing.T) *Store {
	t.Helper()
	st, err := Open(t.Context(), filepath.Join(t.TempDir(), "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestImageRecords(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	if _, err := st.GetImage(ctx, "app"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing image: %v", err)
	}
	if _, ok, err := st.PutImage(ctx, Image{Name: "app", Ref: "r/app:v1", Source: "r/app:v1", RootFS: "/roots/a"}); err != nil || ok {
		t.Fatalf("first put: replaced %v, %v", ok, err)
	}
	old, ok, err := st.PutImage(ctx, Image{Name: "app", Ref: "r/app:v1", Source: "r/app:v1", RootFS: "/roots/b", Meta: []byte(`{"x":1}`)})
	if err != nil || !ok || old.RootFS != "/roots/a" {
		t.Fatalf("replacing put: %+v %v %v", old, ok, err)
	}
	got, err := st.GetImageByRef(ctx, "r/app:v1")
	if err != nil || got.Name != "app" || got.RootFS != "/roots/b" || string(got.Meta) != `{"x":1}` {
		t.Fatalf("by ref: %+v %v", got, err)
	}
	if _, err := st.GetImageByRef(ctx, "r/other:v1"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown ref: %v", err)
	}
	if adopted, err := st.AdoptImage(ctx, Image{Name: "app", RootFS: "/elsewhere"}); err != nil || adopted {
		t.Fatalf("adopting over a recorded image: %v %v", adopted, err)
	}
	if adopted, err := st.AdoptImage(ctx, Image{Name: "default", RootFS: "/images/default/rootfs"}); err != nil || !adopted {
		t.Fatalf("adopting a new image: %v %v", adopted, err)
	}
	imgs, err := st.ListImages(ctx)
	if err != nil || len(imgs) != 2 || imgs[0].Name != "app" || imgs[1].Name != "default" {
		t.Fatalf("list: %+v %v", imgs, err)
	}
}

func TestDeleteImageChecksUsersInOneTransaction(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	if _, _, err := st.PutImage(ctx, Image{Name: "tmpl", RootFS: "/roots/t", Snapshot: "own"}); err != nil {
		t.Fatal(err)
	}
	// The template's own snapshot does not keep it.
	if err := st.InsertSnapshot(ctx, Snapshot{ID: "own", Image: "tmpl", State: SnapshotReady, RootFS: "/roots/t"}); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertSandbox(ctx, Sandbox{ID: "sb1", Image: "tmpl", State: StateRunning, RootFS: "/roots/t"}); err != nil {
		t.Fatal(err)
	}
	users, err := st.ImageUsers(ctx, "tmpl")
	if err != nil || !slices.Equal(users, []string{"sandbox sb1"}) {
		t.Fatalf("users: %v %v", users, err)
	}
	if _, err := st.DeleteImage(ctx, "tmpl"); !errdefs.IsConflict(err) {
		t.Fatalf("deleting an image in use: %v", err)
	}
	if err := st.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	img, err := st.DeleteImage(ctx, "tmpl")
	if err != nil || img.Snapshot != "own" {
		t.Fatalf("deleting an unused template: %+v %v", img, err)
	}
	if _, err := st.DeleteImage(ctx, "tmpl"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleting it again: %v", err)
	}
}

func TestCollectImageRoots(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	for _, r := range []string{"/roots/named", "/roots/sandbox", "/roots/snapshot", "/roots/free", "/roots/pending"} {
		if err := st.AddImageRoot(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.FinishPendingImageRoots(ctx, "/roots/sandbox", "/roots/snapshot", "/roots/free"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutImage(ctx, Image{Name: "app", RootFS: "/roots/named"}); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertSandbox(ctx, Sandbox{ID: "sb", Image: "old", State: StateRunning, RootFS: "/roots/sandbox"}); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertSnapshot(ctx, Snapshot{ID: "sn", Image: "old", State: SnapshotReady, RootFS: "/roots/snapshot"}); err != nil {
		t.Fatal(err)
	}
	// Roots this daemon did not make (adopted) are never collected.
	if _, err := st.AdoptImage(ctx, Image{Name: "default", RootFS: "/images/default/rootfs"}); err != nil {
		t.Fatal(err)
	}
	roots, err := st.CollectImageRoots(ctx)
	if err != nil || !slices.Equal(roots, []string{"/roots/free"}) {
		t.Fatalf("collected %v, %v; want only /roots/free", roots, err)
	}
	if roots, _ := st.CollectImageRoots(ctx); len(roots) != 0 {
		t.Fatalf("collected again: %v", roots)
	}
	// A restart gives up what killed installs left pending.
	if err := st.FinishPendingImageRoots(ctx); err != nil {
		t.Fatal(err)
	}
	if roots, _ := st.CollectImageRoots(ctx); !slices.Equal(roots, []string{"/roots/pending"}) {
		t.Fatalf("after a restart: %v", roots)
	}
	// Replacing an image frees its old root.
	if _, _, err := st.PutImage(ctx, Image{Name: "app", RootFS: "/roots/new"}); err != nil {
		t.Fatal(err)
	}
	if roots, _ := st.CollectImageRoots(ctx); !slices.Equal(roots, []string{"/roots/named"}) {
		t.Fatalf("after replacing the image: %v", roots)
	}
}
