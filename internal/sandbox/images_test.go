package sandbox

import (
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// oldSchema is the database as versions before the images table wrote it.
const oldSchema = `
CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT UNIQUE, image TEXT NOT NULL, state TEXT NOT NULL,
	memory_mib INTEGER NOT NULL, cpus REAL NOT NULL, env TEXT NOT NULL, error TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, snapshot TEXT NOT NULL DEFAULT '',
	engine_id TEXT NOT NULL DEFAULT '', rootfs TEXT NOT NULL DEFAULT '', opts TEXT NOT NULL DEFAULT '{}');
CREATE TABLE snapshots (id TEXT PRIMARY KEY, name TEXT UNIQUE, sandbox TEXT NOT NULL, image TEXT NOT NULL,
	state TEXT NOT NULL, memory_mib INTEGER NOT NULL, cpus REAL NOT NULL, env TEXT NOT NULL, path TEXT NOT NULL,
	size_bytes INTEGER NOT NULL DEFAULT 0, implicit INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
	rootfs TEXT NOT NULL DEFAULT '', opts TEXT NOT NULL DEFAULT '{}');`

// oldImages writes an image directory the way versions that kept image
// metadata in image.json did: the default image (root in default/rootfs),
// a pulled image with a versioned root under .roots/, an image from before
// roots were versioned, and a template. It returns the directory.
func oldImages(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	desc := func(name string, v map[string]any) {
		t.Helper()
		v["name"] = name
		v["created_at"] = "2026-11-30T10:00:00Z"
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		write(name+"/image.json", string(b))
	}
	desc("default", map[string]any{"source": "debootstrap --variant=minbase --include=python3 bookworm http://deb.debian.org/debian", "size_bytes": 100})
	write("default/rootfs/etc/os-release", "debian")
	desc("app", map[string]any{"source": "127.0.0.1:5000/team/app:v1", "root": "0a1b2c3d4e5f", "platform": "linux/amd64",
		"manifest_digest": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
		"layers":          []string{"sha256:2222222222222222222222222222222222222222222222222222222222222222"},
		"config":          map[string]any{"env": []string{"PATH=/bin"}, "working_dir": "/app"}})
	write(".roots/0a1b2c3d4e5f/app/main.py", "print(1)")
	write("blobs/sha256/2222222222222222222222222222222222222222222222222222222222222222", "layer")
	desc("old", map[string]any{"source": "/home/me/old.tar"})
	write("old/rootfs/hello", "old")
	desc("tmpl", map[string]any{"source": "built from default in sandbox 0123456789abcdef", "root": "aaaaaaaaaaaa", "snapshot": "5555555555555555"})
	write(".roots/aaaaaaaaaaaa/hello", "tmpl")
	return dir
}

// oldDataDir writes a data dir's database as those versions did: a
// sandbox of app and the template's snapshot.
func oldDataDir(t *testing.T, images string) string {
	t.Helper()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UnixNano()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{oldSchema, nil},
		{`INSERT INTO sandboxes (id, image, state, memory_mib, cpus, env, created_at, updated_at, rootfs)
			VALUES ('0123456789abcdef', 'app', 'running', 512, 1, '[]', ?, ?, ?)`, []any{now, now, filepath.Join(images, ".roots/0a1b2c3d4e5f")}},
		{`INSERT INTO snapshots (id, sandbox, image, state, memory_mib, cpus, env, path, created_at, rootfs)
			VALUES ('5555555555555555', 'fedcba9876543210', 'tmpl', 'ready', 512, 1, '[]', '/x', ?, ?)`, []any{now, filepath.Join(images, ".roots/aaaaaaaaaaaa")}},
	} {
		if _, err := db.Exec(q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	return dir
}

func openManager(t *testing.T, dataDir, imagesDir string) (*Manager, *store.Store) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(dataDir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	files, err := image.NewStore(imagesDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{}, nil, st, files), st
}

func names(imgs []image.Image) []string {
	var out []string
	for _, img := range imgs {
		out = append(out, img.Name)
	}
	return out
}

// TestImageMigration: a data dir and image directory written by versions
// that kept image metadata in image.json files are taken over by the store:
// every image keeps its root, config, template snapshot and users; a
// pulled image answers to its reference; a removal sticks across restarts;
// and a second daemon with a fresh data dir sharing the image directory
// finds the images there without building anything.
func TestImageMigration(t *testing.T) {
	ctx := t.Context()
	imagesDir := oldImages(t)
	dataDir := oldDataDir(t, imagesDir)
	m, st := openManager(t, dataDir, imagesDir)

	imgs, err := m.Images().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(imgs); !slices.Equal(got, []string{"app", "default", "old", "tmpl"}) {
		t.Fatalf("images after migration: %v", got)
	}
	app, users, err := m.Images().Inspect(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if app.RootFS != filepath.Join(imagesDir, ".roots/0a1b2c3d4e5f") || app.Config.WorkingDir != "/app" || app.Platform != "linux/amd64" ||
		app.Ref != "127.0.0.1:5000/team/app:v1" || !slices.Equal(users, []string{"sandbox 0123456789abcdef"}) {
		t.Fatalf("app after migration: %+v, users %v", app, users)
	}
	byRef, _, err := m.Images().Inspect(ctx, "127.0.0.1:5000/team/app:v1")
	if err != nil || byRef.Name != "app" {
		t.Fatalf("app by its reference: %+v %v", byRef, err)
	}
	// Find is Inspect's image without its users.
	if found, err := m.Images().Find(ctx, "127.0.0.1:5000/team/app:v1"); err != nil || found.Name != "app" || found.RootFS != app.RootFS || !found.CreatedAt.Equal(app.CreatedAt) {
		t.Fatalf("finding app by its reference: %+v %v", found, err)
	}
	if _, err := m.Images().Find(ctx, "nosuch"); !errdefs.IsNotFound(err) {
		t.Fatalf("finding an image the daemon does not have: %v", err)
	}
	if old, _, err := m.Images().Inspect(ctx, "old"); err != nil || old.RootFS != filepath.Join(imagesDir, "old/rootfs") || old.Ref != "" {
		t.Fatalf("an image from before versioned roots: %+v %v", old, err)
	}
	// The template keeps its snapshot, which does not count as a user.
	tmpl, users, err := m.Images().Inspect(ctx, "tmpl")
	if err != nil || tmpl.Snapshot != "5555555555555555" || len(users) != 0 {
		t.Fatalf("template after migration: %+v %v %v", tmpl, users, err)
	}

	// The sandbox on app keeps it; old goes with its directory.
	if err := m.Images().Remove(ctx, "app"); !errdefs.IsConflict(err) {
		t.Fatalf("removing an image a migrated sandbox uses: %v", err)
	}
	if err := m.Images().Remove(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(imagesDir, "old")); !os.IsNotExist(err) {
		t.Fatalf("the removed image's directory: %v", err)
	}
	// Adopted roots are not this daemon's to collect, nor are blobs an
	// image uses.
	for _, p := range []string{".roots/0a1b2c3d4e5f/app/main.py", ".roots/aaaaaaaaaaaa/hello", "default/rootfs/etc/os-release",
		"blobs/sha256/2222222222222222222222222222222222222222222222222222222222222222"} {
		if _, err := os.Stat(filepath.Join(imagesDir, p)); err != nil {
			t.Errorf("after removing another image: %v", err)
		}
	}

	// A restart on the same data dir: the removal sticks, nothing is
	// adopted twice.
	st.Close()
	m, _ = openManager(t, dataDir, imagesDir)
	imgs, err = m.Images().List(ctx)
	if got := names(imgs); err != nil || !slices.Equal(got, []string{"app", "default", "tmpl"}) {
		t.Fatalf("images after a restart: %v %v", got, err)
	}

	// A second daemon with a fresh data dir on the same image directory.
	m2, _ := openManager(t, t.TempDir(), imagesDir)
	def, _, err := m2.Images().Inspect(ctx, image.Default)
	if err != nil || def.RootFS != filepath.Join(imagesDir, "default/rootfs") {
		t.Fatalf("default image from a fresh data dir: %+v %v", def, err)
	}
	if users, err := m2.Images().Users(ctx, "app"); err != nil || len(users) != 0 {
		t.Fatalf("another daemon's sandboxes are not this one's users: %v %v", users, err)
	}
}

// TestImageRefValidation: what a client gives as an image is checked
// before it reaches the store: a name, a reference, or a 4xx saying what
// to do.
func TestImageRefValidation(t *testing.T) {
	imagesDir := oldImages(t)
	m, _ := openManager(t, t.TempDir(), imagesDir)
	long := strings.Repeat("a", 600)
	for _, tc := range []struct {
		ref   string
		class errdefs.Class
	}{
		{"", errdefs.InvalidArgument},
		{long, errdefs.InvalidArgument},
		{"app\x1b[2J", errdefs.InvalidArgument},
		{"app\nfake log line", errdefs.InvalidArgument},
		{"caf\u00e9", errdefs.InvalidArgument},
		{"../../etc", errdefs.NotFound}, // a reference to go-containerregistry; only ever a key
		{"Upper/Case:Tag", errdefs.InvalidArgument},
		{"app@sha256:short", errdefs.InvalidArgument},
		{"127.0.0.1:5000/team/never:v1", errdefs.NotFound},
		{"python:3.12-slim", errdefs.NotFound},
	} {
		_, _, err := m.Images().Inspect(t.Context(), tc.ref)
		if errdefs.ClassOf(err) != tc.class {
			t.Errorf("Image(%q): %v, want %s", tc.ref, err, tc.class)
		}
	}
	_, err := m.images.Get(t.Context(), "python:3.12-slim")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "clade image pull python:3.12-slim") {
		t.Errorf("a reference never pulled: %v", err)
	}
}

// TestBuiltinImageBuiltOnDemand: a create's image lookup of a built-in
// image the directory lacks answers a retryable Unavailable that says it
// is being built, starts the build once, and finds the image when it is
// done. debootstrap is a stand-in here, and the recipe one of the test's
// own (e2b-base's apt step needs a real root); internal/front/e2b's
// TestBaseTemplate boots the real one.
func TestBuiltinImageBuiltOnDemand(t *testing.T) {
	const name = "test-on-demand"
	image.RegisterRecipe(image.Recipe{Name: name, About: "a test's", Include: []string{"bash"}})
	bin := t.TempDir()
	script := "#!/bin/sh\necho run >> " + filepath.Join(bin, "runs") + "\nmkdir -p \"$4/etc\"\n"
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	m, _ := openManager(t, t.TempDir(), t.TempDir())
	_, err := m.images.Get(t.Context(), name)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "being built") {
		t.Fatalf("first lookup: %v, want Unavailable saying it is being built", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		img, err := m.images.Get(t.Context(), name)
		if err == nil {
			if img.Name != name {
				t.Fatalf("got image %q", img.Name)
			}
			break
		}
		if !errdefs.IsUnavailable(err) {
			t.Fatalf("lookup while building: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the built-in image was never built")
		}
		time.Sleep(20 * time.Millisecond)
	}
	runs, _ := os.ReadFile(filepath.Join(bin, "runs"))
	if n := strings.Count(string(runs), "run"); n != 1 {
		t.Fatalf("debootstrap ran %d times for concurrent lookups, want once", n)
	}
}
