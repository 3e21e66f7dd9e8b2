package volume

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/store"
	"golang.org/x/sys/unix"
)

// TestCloneFileKeepsHoles: a clone has the same bytes, and a copy
// allocates only what the source has allocated.
func TestCloneFileKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := bytes.Repeat([]byte("clade"), 200_000)
	for _, off := range []int64{0, 30 << 20, size - int64(len(data))} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	method, err := cloneFile(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the clone's bytes differ")
	}
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if method == CloneCopy && st.Blocks*512 > 8<<20 {
		t.Fatalf("a copy of a 64 MiB file with 3 MiB of data allocated %d MiB: holes were filled", st.Blocks*512>>20)
	}
	if _, err := cloneFile(src, dst); !os.IsExist(err) {
		t.Fatalf("a clone onto an existing file: %v", err)
	}
}

func TestValidPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/data", true},
		{"/var/lib/postgresql", true},
		{"/root/.cache", true},
		{"/", false},
		{"", false},
		{"data", false},
		{"/data/", false},
		{"/data/../etc", false},
		{"/data//x", false},
		{"/./data", false},
		{"/proc", false},
		{"/proc/sys", false},
		{"/dev/shm", false},
		{"/sys", false},
		{"/.clade", false},
		{"/.clade/run", false},
		{"/etc", false}, // would cover /etc/resolv.conf
		{"/etc/resolv.conf", false},
		{"/a:b", false},
		{"/a,b", false},
		{"/a\x00b", false},
	} {
		err := ValidPath(tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("ValidPath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
		if err != nil && !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("ValidPath(%q): %v is not InvalidArgument", tc.path, err)
		}
	}
}

// TestCloneReflinkXFS: on a file system that shares extents (XFS made
// here on a loop image), a clone is a reflink and costs no space and about
// the same time whatever the volume's size: 10 MiB and 1 GiB.
func TestCloneReflinkXFS(t *testing.T) {
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("mkfs.xfs is not installed (make deps installs xfsprogs)")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "xfs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := mountXFS(img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(mnt); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	for _, size := range []int64{10 << 20, 1 << 30} {
		src := filepath.Join(mnt, fmt.Sprintf("vol-%d", size))
		if err := writeVolumeFile(src, size); err != nil {
			t.Fatal(err)
		}
		var before, after unix.Statfs_t
		_ = unix.Statfs(mnt, &before)
		start := time.Now()
		method, err := cloneFile(src, src+".clone")
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Statfs(mnt, &after)
		used := (int64(before.Bfree) - int64(after.Bfree)) * before.Bsize
		t.Logf("clone of a %d MiB volume: %s in %v, %d KiB of new space", size>>20, method, took, used>>10)
		if method != CloneReflink {
			t.Fatalf("clone on XFS with reflink=1 was a %s", method)
		}
		if used > 1<<20 {
			t.Fatalf("a reflink of %d MiB took %d KiB of space: extents were copied", size>>20, used>>10)
		}
	}
}

// mountXFS mounts an XFS image through a loop device.
func mountXFS(img, mnt string) error {
	out, err := exec.Command("mount", "-o", "loop", "-t", "xfs", img, mnt).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount: %v: %s", err, out)
	}
	return nil
}

// writeVolumeFile writes size bytes of data (allocated, not a hole).
func writeVolumeFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return err
	}
	_, err = f.WriteAt(bytes.Repeat([]byte("v"), 1<<20), 0)
	return err
}

// TestVolumesReserveRoom: a volume takes its whole size on the host at
// create, so volumes cannot promise more than the host's disk holds: with
// sparse images a second volume fit, and filling both filled the host,
// whereupon the loop device's writes failed and ext4 inside lost writes
// the sandbox had seen succeed. A fork child's copy reserves its size too.
func TestVolumesReserveRoom(t *testing.T) {
	mnt, st := smallHost(t, 200)
	m, err := New(Config{Dir: filepath.Join(mnt, "volumes"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Create(t.Context(), "a", 112<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	in, err := m.Get(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if in.UsedBytes < a.SizeBytes {
		t.Fatalf("a new volume takes %d MiB of its %d MiB on the host: not reserved", in.UsedBytes>>20, a.SizeBytes>>20)
	}
	_, err = m.Create(t.Context(), "b", 112<<20, false)
	if !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("a second 112 MiB volume on a 200 MiB host: %v, want ResourceExhausted", err)
	}
	if vs, _ := st.ListVolumes(t.Context()); len(vs) != 1 {
		t.Fatalf("after the refused create the store has %d volumes, want 1", len(vs))
	}
	if ents, _ := os.ReadDir(filepath.Join(mnt, "volumes", "named")); len(ents) != 1 {
		t.Fatalf("after the refused create named/ holds %d entries, want 1", len(ents))
	}

	// A child's copy of a snapshot's (sparse) copy is reserved as well:
	// a 64 MiB one does not fit in what is left.
	sn := filepath.Join(mnt, "volumes", "snapshots", "sn1")
	if err := os.MkdirAll(sn, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sn, "0.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(sn, "0.img"), 80<<20); err != nil {
		t.Fatal(err)
	}
	rec := store.Sandbox{ID: "child1", Snapshot: "sn1", Opts: store.Options{Volumes: []store.VolumeMount{{Volume: a.ID, Name: "a", Path: "/a", Clone: CloneCopy}}}}
	vm := rec.Opts.Volumes[0]
	err = m.ensureCopy(rec, 0, vm, m.ownImage(rec.ID, 0, vm))
	if !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("a child's 80 MiB copy with ~85 MiB left after a 112 MiB volume: %v, want ResourceExhausted", err)
	}
	if _, err := os.Stat(m.ownImage(rec.ID, 0, vm) + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("a refused copy left its file: %v", err)
	}
}

// TestMountRefusedWhileRemoving: a volume rm checks the users and marks the
// volume removing before it deletes it; a sandbox recorded after that
// check (a create racing the rm) must not mount the volume it deletes.
func TestMountRefusedWhileRemoving(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := New(Config{Dir: filepath.Join(dir, "volumes"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.Create(t.Context(), "racy", MinSize, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.removeFiles(v.ID) })
	rec := store.Sandbox{ID: "late", Opts: store.Options{Volumes: []store.VolumeMount{{Volume: v.ID, Name: v.Name, Path: "/data"}}}}
	// Where an rm stands once its check found no users.
	if err := st.SetVolumeState(t.Context(), v.ID, store.VolumeRemoving); err != nil {
		t.Fatal(err)
	}
	var spec engine.Spec
	err = m.BeforeStart(t.Context(), rec, &spec)
	if !errdefs.IsNotFound(err) || len(spec.Mounts) != 0 {
		t.Fatalf("mounting a volume being removed: %v, mounts %+v; want NotFound and no mount", err, spec.Mounts)
	}
	if mounted(m.mountPoint(namedKey(v.ID))) {
		t.Fatal("the volume being removed is mounted")
	}
}

// TestVolumePathIsAFile: a volume path that is a file in the image (or
// under one) is refused before anything is mounted, with a message saying
// what to do; directories, new paths and paths through symlinks are left
// to runsc.
func TestVolumePathIsAFile(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	// A hostile image's symlinks aim volume paths that pass ValidPath at
	// what the sandbox needs, or at a file.
	for name, target := range map[string]string{
		"agent": "/.clade", "up": "../../../.clade/run", "top": "/", "procs": "usr/../proc",
		"pw": "/etc/passwd", "loop": "loop", "usrlink": "/usr",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		path string
		want string // "": ok
	}{
		{"/etc/passwd", "is a file in the image"},
		{"/etc/passwd/x", "is a file in the image"},
		{"/etc", ""},
		{"/new/dir", ""},
		{"/bin/x", ""},
		{"/usrlink/bin/new", ""},
		{"/pw", "is a file in the image"},
		{"/pw/x", "is a file in the image"},
		{"/agent", "covers /.clade"},
		{"/agent/run", "covers /.clade"},
		{"/up", "to /.clade/run"},
		{"/usrlink/../.clade/bin", "covers /.clade"},
		{"/top", "to /"},
		{"/top/proc/x", "covers /proc"},
		{"/procs/1", "covers /proc"},
		{"/loop/x", "symbolic links"},
	} {
		err := notAFile(root, tc.path)
		if (tc.want == "") != (err == nil) || (err != nil && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want))) {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
		}
	}
	m, err := New(Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	spec := engine.Spec{RootFS: root}
	rec := store.Sandbox{ID: "sb", Opts: store.Options{Volumes: []store.VolumeMount{{Volume: "v", Name: "v", Path: "/etc/passwd"}}}}
	if err := m.BeforeStart(t.Context(), rec, &spec); !errdefs.IsInvalidArgument(err) || len(spec.Mounts) != 0 {
		t.Fatalf("BeforeStart with a volume on a file: %v, mounts %+v", err, spec.Mounts)
	}
}

// TestEncryptedVolumesReserveRoom: an encrypted volume's room is reserved
// too (its ciphertext, which is on the host's disk), so a second one that
// does not fit is refused instead of filling the disk later; the reserved
// image still opens as a sound ext4.
func TestEncryptedVolumesReserveRoom(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	mnt, st := smallHost(t, 200)
	key, err := secret.NewKey(bytes.Repeat([]byte{7}, 32), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Dir: filepath.Join(mnt, "volumes"), Store: st, Sealer: key})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Create(t.Context(), "a", 112<<20, true)
	if err != nil {
		t.Fatal(err)
	}
	in, err := m.Get(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if in.UsedBytes < a.SizeBytes {
		t.Fatalf("a new encrypted volume takes %d MiB of its %d MiB on the host: not reserved", in.UsedBytes>>20, a.SizeBytes>>20)
	}
	_, err = m.Create(t.Context(), "b", 112<<20, true)
	if !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("a second 112 MiB encrypted volume on a 200 MiB host: %v, want ResourceExhausted", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(mnt, "volumes", "named")); len(ents) != 1 {
		t.Fatalf("after the refused create named/ holds %d entries, want 1", len(ents))
	}
	view := m.mountPoint("check")
	img, err := m.openView(t.Context(), a.ID, a.Key, filepath.Join(m.namedDir(a.ID), cryptDir), view)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := closeView(view); err != nil {
			t.Error(err)
		}
	}()
	if out, err := exec.Command("e2fsck", "-n", "-f", img).CombinedOutput(); err != nil {
		t.Fatalf("the reserved encrypted image: e2fsck: %v: %s", err, out)
	}
}

// smallHost mounts an ext4 file system of mib MiB of the test's own (the
// host disk volumes live on) and opens a store beside it.
func smallHost(t *testing.T, mib int64) (mnt string, st *store.Store) {
	t.Helper()
	dir := t.TempDir()
	host := filepath.Join(dir, "host.img")
	if err := os.WriteFile(host, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(host, mib<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", host).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt = filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", host, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unmount(mnt); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	st, err := store.Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return mnt, st
}
