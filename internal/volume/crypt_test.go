package volume_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/atrest"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func newMarker(what string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "clade-" + what + "-" + hex.EncodeToString(b)
}

// writeMarker writes m into file p inside sandbox id without m itself on
// any command line (runsc's logs would hold it): it goes in base64.
func writeMarker(t *testing.T, c *sdk.Client, id, p, m string) {
	t.Helper()
	mustSh(t, c, id, "echo "+base64.StdEncoding.EncodeToString([]byte(m))+" | base64 -d > "+p+" && sync "+p)
}

// volumesDir is the daemon's volume directory (in the at-rest view when
// encryption at rest is on).
func volumesDir(d *testenv.Daemon) string {
	if _, err := os.Stat(filepath.Join(d.DataDir, "plain", "volumes")); err == nil {
		return filepath.Join(d.DataDir, "plain", "volumes")
	}
	return filepath.Join(d.DataDir, "volumes")
}

func requireGocryptfs(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
}

// TestEncryptedVolume: an encrypted volume's bytes on disk are ciphertext
// (a marker written in it is in no raw byte under the data dir, its
// copies for snapshots and forks included), it survives sandbox rm,
// sleep/wake and a daemon SIGKILL, moves to a second daemon (another data
// dir, another host key) with export and import and reads back there; a
// wrong key or a bad archive fails with a clear error and leaves nothing;
// volume rm takes its ciphertext and its sealed key.
func TestEncryptedVolume(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	requireGocryptfs(t)
	for _, tc := range []struct {
		name string
		args []string
	}{{"plain-host", nil}, {"encrypt-at-rest", []string{"--encrypt-at-rest"}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a daemon of its own
			testEncryptedVolume(t, tc.args)
		})
	}
}

func testEncryptedVolume(t *testing.T, args []string) {
	atRest := len(args) > 0
	d := testenv.StartDaemon(t, args...)
	c := d.Client
	v, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "vault", SizeBytes: 64 << 20, Encrypt: true})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Encrypted {
		t.Fatalf("create --encrypt gave %+v: not encrypted", v)
	}
	inspect := cli(t, d, "volume", "inspect", "vault")
	if !strings.Contains(inspect, `"encrypted": true`) {
		t.Fatalf("inspect does not say encrypted: %s", inspect)
	}
	key, err := c.VolumeKey(t.Context(), "vault")
	if err != nil || len(key) != 64 {
		t.Fatalf("volume key: %q %v", key, err)
	}
	if strings.Contains(inspect, key) || strings.Contains(cli(t, d, "volume", "ls", "--json"), key) {
		t.Fatal("inspect or ls shows the volume's key")
	}
	vdir := volumesDir(d)
	mnt := filepath.Join(vdir, "mnt")
	// The scan of raw bytes: everything under the data dir but the mounts
	// of volumes in use (and, at rest, the daemon's plain view). Without
	// encryption at rest, a snapshot's memory image is plaintext by design
	// (the daemon says so), so after one only the volume dir is scanned.
	scan := func(afterMemory bool, markers ...string) {
		t.Helper()
		root, skip := d.DataDir, mnt
		if atRest {
			skip = filepath.Join(d.DataDir, "plain")
		} else if afterMemory {
			root = vdir
		}
		if found := testenv.FindMarkers(root, skip, markers); len(found) > 0 {
			t.Fatalf("markers in raw bytes under %s: %v", root, found)
		}
		if at := testenv.FindMarkers(mnt, "", markers); len(at) != len(markers) {
			t.Fatalf("the scan finds %d of %d markers in the mounted volumes: it cannot be trusted (%v)", len(at), len(markers), at)
		}
	}

	a := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "vault", Path: "/data"}}})
	if got := mustSh(t, c, a.ID, "ls -A /data"); got != "" {
		t.Fatalf("a new encrypted volume is not empty: %q", got)
	}
	m1 := newMarker("vault")
	writeMarker(t, c, a.ID, "/data/secret.txt", m1)
	scan(false, m1)

	// Sleep and wake: the view is unmounted while asleep, back at wake.
	if _, err := c.Sleep(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
		t.Fatalf("an asleep sandbox's encrypted volume is still mounted: %v", ents)
	}
	if testenv.FindMarkers(vdir, "", []string{m1})[m1] != nil {
		t.Fatal("the marker is in the volume dir's raw bytes while asleep")
	}
	if got := mustSh(t, c, a.ID, "cat /data/secret.txt"); got != m1 {
		t.Fatalf("after wake the volume reads %q", got)
	}

	// Snapshot and fork: the child's copy is encrypted and its own.
	snap, err := c.SnapshotSandbox(t.Context(), a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(t.Context(), snap.ID, 1)
	if err != nil || len(res.Children) != 1 || res.Children[0].Error != "" {
		t.Fatalf("fork: %+v %v", res, err)
	}
	kid := res.Children[0].ID
	if got := mustSh(t, c, kid, "cat /data/secret.txt"); got != m1 {
		t.Fatalf("the fork child reads %q from its copy", got)
	}
	m2 := newMarker("child")
	writeMarker(t, c, kid, "/data/child.txt", m2)
	if r := sh(t, c, a.ID, "cat /data/child.txt"); r.code == 0 {
		t.Fatal("the parent sees its child's write: the copy is not the child's own")
	}
	scan(true, m1, m2)

	// The data outlives the sandbox and a SIGKILLed daemon; the next
	// daemon collects a plain view nobody uses (what a killed daemon
	// whose sandbox went leaves), its gocryptfs included.
	if err := c.DeleteSandbox(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	stray := filepath.Join(t.TempDir(), "stray")
	const strayKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	if err := atrest.InitDir(t.Context(), stray, strayKey); err != nil {
		t.Fatal(err)
	}
	strayView := filepath.Join(mnt, "cs-stray-0")
	if _, err := atrest.OpenDir(t.Context(), stray, strayView, strayKey); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = atrest.UnmountDir(strayView) })
	d.Start(nil)
	if atrest.Mounted(strayView) || len(testenv.ProcessesMentioning(strayView)) > 0 {
		t.Fatalf("the restarted daemon left an unused encrypted view mounted: %v", testenv.ProcessesMentioning(strayView))
	}
	if got := mustSh(t, c, kid, "cat /data/secret.txt /data/child.txt"); got != m1+m2 {
		t.Fatalf("after the restart the running child reads %q", got)
	}
	b := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "vault", Path: "/v", ReadOnly: true}}})
	if got := mustSh(t, c, b.ID, "cat /v/secret.txt"); got != m1 {
		t.Fatalf("a new sandbox after the restart reads %q", got)
	}

	// Export (in use: copied frozen) and import on a second daemon.
	dir := t.TempDir()
	archive, keyFile := filepath.Join(dir, "vault.tar"), filepath.Join(dir, "vault.key")
	cli(t, d, "volume", "export", "vault", archive, "--key-file", keyFile)
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	// Sparse: the 64 MiB volume holds a few files; its unwritten blocks
	// take no disk in the archive.
	if fi, err := os.Stat(archive); err != nil || fi.Size() < 64<<20 || fi.Sys().(*syscall.Stat_t).Blocks*512 > fi.Size()/4 {
		t.Fatalf("the archive is not sparse: %d bytes, %d allocated (%v)", fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks*512, err)
	}
	if raw, _ := os.ReadFile(archive); bytes.Contains(raw, []byte(m1)) || bytes.Contains(raw, []byte(key)) || bytes.Contains(raw, []byte("disk.img")) {
		t.Fatal("the export holds the marker, the key or a plain file name")
	}
	if out, err := exec.Command(d.Bin, "--host", d.Socket, "volume", "export", "vault", archive, "--key-file", keyFile+"2").CombinedOutput(); err == nil {
		t.Fatalf("export over an existing file succeeded: %s", out)
	}
	if _, err := os.Stat(keyFile + "2"); !os.IsNotExist(err) {
		t.Fatalf("a failed export left its key file: %v", err)
	}

	d2 := testenv.StartDaemon(t)
	c2 := d2.Client
	named2 := filepath.Join(volumesDir(d2), "named")
	empty := func(what string) {
		t.Helper()
		if vs, err := c2.ListVolumes(t.Context()); err != nil || len(vs) != 0 {
			t.Fatalf("%s: the second daemon has volumes %+v (%v)", what, vs, err)
		}
		if ents, _ := os.ReadDir(named2); len(ents) != 0 {
			t.Fatalf("%s left %d entries in named/", what, len(ents))
		}
	}
	wrong := filepath.Join(dir, "wrong.key")
	if err := os.WriteFile(wrong, []byte(strayKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(d2.Bin, "--host", d2.Socket, "volume", "import", "vault", archive, "--key-file", wrong).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "key does not open") {
		t.Fatalf("import with a wrong key: %v: %s", err, out)
	}
	empty("a wrong key")
	for _, bad := range []struct{ name, body, want string }{
		{"junk", "not a tar at all", "not a clade volume export"},
		{"../evil", "", "bad volume name"},
	} {
		_, err := c2.ImportVolume(t.Context(), bad.name, strings.NewReader(bad.body), key)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("import %q: %v, want %q", bad.name, err, bad.want)
		}
	}
	// An archive with a path in it (a planted ../).
	var evil bytes.Buffer
	mustTar(t, &evil, "../gocryptfs.conf", "x")
	if _, err := c2.ImportVolume(t.Context(), "evil", &evil, key); err == nil || !strings.Contains(err.Error(), "unexpected entry") {
		t.Fatalf("import of an archive with ../: %v", err)
	}
	// The exporter's gocryptfs.conf asking for a huge scrypt cost, a FIDO2
	// token, an unknown feature or another on-disk format: refused as the
	// export's fault (a 400), with no host path in the message.
	for _, conf := range []struct{ name, old, new, want string }{
		{"costly", `"N": 1024`, `"N": 1073741824`, "scrypt cost"},
		{"fido", `"HKDF",`, `"HKDF", "FIDO2",`, `feature flag "FIDO2"`},
		{"bogus", `"HKDF",`, `"HKDF", "Bogus",`, `feature flag "Bogus"`},
		{"plainnames", `"HKDF",`, `"HKDF", "PlaintextNames",`, `feature flag "PlaintextNames"`},
		{"format1", `"Version": 2`, `"Version": 1`, "on-disk format 1"},
	} {
		var changed bytes.Buffer
		tw := tar.NewWriter(&changed)
		rawTar, err := os.Open(archive)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rawTar)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			body, _ := io.ReadAll(tr)
			if h.Name == "gocryptfs.conf" {
				if !bytes.Contains(body, []byte(conf.old)) {
					t.Fatalf("gocryptfs.conf has no %s: %s", conf.old, body)
				}
				body = bytes.Replace(body, []byte(conf.old), []byte(conf.new), 1)
			}
			h.Size = int64(len(body))
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			_, _ = tw.Write(body)
		}
		rawTar.Close()
		tw.Close()
		_, err = c2.ImportVolume(t.Context(), conf.name, &changed, key)
		var se *sdk.Error
		if !errors.As(err, &se) || se.Status != 400 || !strings.Contains(err.Error(), conf.want) || strings.Contains(err.Error(), d2.DataDir) {
			t.Fatalf("import of a config %s: %v, want an invalid-argument error saying %q without host paths", conf.name, err, conf.want)
		}
	}
	empty("bad archives")
	cli(t, d2, "volume", "import", "vault", archive, "--key-file", keyFile)
	if out, err := exec.Command(d2.Bin, "--host", d2.Socket, "volume", "import", "vault", archive, "--key-file", keyFile).CombinedOutput(); err == nil || !strings.Contains(string(out), "already exists") {
		t.Fatalf("a second import under the same name: %v: %s", err, out)
	}
	v2, err := c2.GetVolume(t.Context(), "vault")
	if err != nil || !v2.Encrypted || v2.SizeBytes != v.SizeBytes {
		t.Fatalf("imported volume %+v %v, want encrypted of %d bytes", v2, err, v.SizeBytes)
	}
	s2 := create(t, c2, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "vault", Path: "/data"}}})
	if got := mustSh(t, c2, s2.ID, "cat /data/secret.txt"); got != m1 {
		t.Fatalf("the imported volume reads %q on the second daemon", got)
	}
	if err := c2.DeleteSandbox(t.Context(), s2.ID); err != nil {
		t.Fatal(err)
	}

	// rm: ciphertext and sealed key go (the child's copy keeps its own).
	st, err := store.Open(t.Context(), filepath.Join(d.DataDir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.GetVolume(t.Context(), "vault")
	st.Close()
	if err != nil || !rec.Encrypted() {
		t.Fatalf("store record %+v %v", rec, err)
	}
	for _, id := range []string{b.ID, kid} {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(t.Context(), snap.ID); err != nil {
		t.Fatal(err)
	}
	cli(t, d, "volume", "rm", "vault")
	if _, err := os.Stat(filepath.Join(vdir, "named", rec.ID)); !os.IsNotExist(err) {
		t.Fatalf("the volume's ciphertext is left after rm: %v", err)
	}
	sealed := hex.EncodeToString(rec.Key)
	for _, f := range []string{"clade.db", "clade.db-wal", "clade.db-shm"} {
		raw, _ := os.ReadFile(filepath.Join(d.DataDir, f))
		if bytes.Contains(raw, rec.Key) || strings.Contains(string(raw), sealed) || strings.Contains(string(raw), base64.StdEncoding.EncodeToString(rec.Key)) {
			t.Fatalf("%s still holds the removed volume's sealed key", f)
		}
	}
	for _, sub := range []string{"named", "sandboxes", "snapshots", "mnt"} {
		if ents, _ := os.ReadDir(filepath.Join(vdir, sub)); len(ents) != 0 {
			t.Errorf("volumes/%s holds %d entries after rm", sub, len(ents))
		}
	}
	var list []sdk.Volume
	if err := json.Unmarshal([]byte(cli(t, d, "volume", "ls", "--json")), &list); err != nil || len(list) != 0 {
		t.Fatalf("volume ls after rm: %v %v", list, err)
	}
}

// mustTar writes a one-file tar.
func mustTar(t *testing.T, w *bytes.Buffer, name, body string) {
	t.Helper()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEncryptedVolumeThroughput measures sequential write and cold read
// of 512 MiB inside a sandbox, plain volume vs encrypted, interleaved, and
// logs them. It is a measurement, not a check: run it with
// CLADE_VOLUME_THROUGHPUT=1 (and -v); extra daemon flags in
// CLADE_VOLUME_THROUGHPUT_ARGS (e.g. --encrypt-at-rest).
func TestEncryptedVolumeThroughput(t *testing.T) {
	if os.Getenv("CLADE_VOLUME_THROUGHPUT") == "" {
		t.Skip("a measurement: set CLADE_VOLUME_THROUGHPUT=1")
	}
	requireGocryptfs(t)
	d := testenv.StartDaemon(t, strings.Fields(os.Getenv("CLADE_VOLUME_THROUGHPUT_ARGS"))...)
	c := d.Client
	for _, enc := range []bool{false, true} {
		name := "plain"
		if enc {
			name = "enc"
		}
		if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: name, SizeBytes: 1 << 30, Encrypt: enc}); err != nil {
			t.Fatal(err)
		}
	}
	const mib = 512
	rate := map[string][]float64{}
	for round := 0; round < 3; round++ {
		for _, name := range []string{"plain", "enc"} {
			w := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: name, Path: "/v"}}})
			start := time.Now()
			mustSh(t, c, w.ID, fmt.Sprintf("dd if=/dev/zero of=/v/f bs=1M count=%d conv=fsync 2>/dev/null", mib))
			rate[name+" write"] = append(rate[name+" write"], mib/time.Since(start).Seconds())
			if err := c.DeleteSandbox(t.Context(), w.ID); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
				t.Fatal(err)
			}
			r := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: name, Path: "/v"}}})
			start = time.Now()
			mustSh(t, c, r.ID, "dd if=/v/f of=/dev/null bs=1M 2>/dev/null; rm /v/f")
			rate[name+" read"] = append(rate[name+" read"], mib/time.Since(start).Seconds())
			if err := c.DeleteSandbox(t.Context(), r.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Wake of a sandbox with each volume: an encrypted one adds a
	// gocryptfs mount.
	for _, name := range []string{"plain", "enc"} {
		sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: name, Path: "/v"}}})
		defer c.DeleteSandbox(t.Context(), sb.ID)
	}
	sbs, err := c.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		for _, sb := range sbs {
			name := sb.Volumes[0].Name
			if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := c.Wake(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			rate[name+" wake ms"] = append(rate[name+" wake ms"], float64(time.Since(start).Milliseconds()))
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	for _, k := range []string{"plain write", "enc write", "plain read", "enc read", "plain wake ms", "enc wake ms"} {
		v := append([]float64(nil), rate[k]...)
		slices.Sort(v)
		t.Logf("%-14s median %6.0f (MiB/s or ms; runs %.0f)", k, v[len(v)/2], rate[k])
	}
	t.Logf("load average: %s", strings.TrimSpace(string(load)))
}

// TestEncryptedVolumeGivenKey: volume create --encrypt --key-file takes
// the user's key: the volume opens with it (an export's key file is that
// key; an import with it reads the data back), the key is in no log, and
// malformed keys are refused with nothing made.
func TestEncryptedVolumeGivenKey(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	requireGocryptfs(t)
	d := testenv.StartDaemon(t)
	c := d.Client
	dir := t.TempDir()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	key := hex.EncodeToString(raw)
	keyFile := filepath.Join(dir, "mine.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ name, content string }{{"short", key[:40]}, {"not-hex", strings.Repeat("zz", 32)}, {"empty", ""}} {
		p := filepath.Join(dir, bad.name)
		if err := os.WriteFile(p, []byte(bad.content), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(d.Bin, "--host", d.Socket, "volume", "create", "v-"+bad.name, "--encrypt", "--key-file", p).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "hex of 32 bytes") || (bad.content != "" && strings.Contains(string(out), bad.content)) {
			t.Fatalf("create with a %s key: %v: %s", bad.name, err, out)
		}
	}
	out, err := exec.Command(d.Bin, "--host", d.Socket, "volume", "create", "plainkey", "--key-file", keyFile).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--encrypt") {
		t.Fatalf("--key-file without --encrypt: %v: %s", err, out)
	}
	// The API: a key without encrypt is refused, and no error shows it.
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "nokey", Key: key}); err == nil || !strings.Contains(err.Error(), "encrypt") || strings.Contains(err.Error(), key) {
		t.Fatalf("API create with a key, no encrypt: %v", err)
	}
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "badkey", Encrypt: true, Key: key[:62] + "zz"}); err == nil || strings.Contains(err.Error(), key[:62]) {
		t.Fatalf("API create with a malformed key: %v", err)
	}
	if vs, err := c.ListVolumes(t.Context()); err != nil || len(vs) != 0 {
		t.Fatalf("refused creates left volumes: %+v %v", vs, err)
	}
	cli(t, d, "volume", "create", "mine", "--encrypt", "--key-file", keyFile, "--size", "32MiB")
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "mine", Path: "/v"}}})
	mustSh(t, c, sb.ID, "echo given-key-data > /v/f && sync")
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	archive, exported := filepath.Join(dir, "mine.tar"), filepath.Join(dir, "exported.key")
	cli(t, d, "volume", "export", "mine", archive, "--key-file", exported)
	if b, _ := os.ReadFile(exported); strings.TrimSpace(string(b)) != key {
		t.Fatalf("the volume's key is not the one given: export wrote %q", b)
	}
	cli(t, d, "volume", "import", "again", archive, "--key-file", keyFile)
	sb2 := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "again", Path: "/v"}}})
	if got := mustSh(t, c, sb2.ID, "cat /v/f"); got != "given-key-data\n" {
		t.Fatalf("the import opened with the given key reads %q", got)
	}
	if strings.Contains(d.Log(), key) {
		t.Fatal("the daemon's log holds the given key")
	}
	for _, f := range []string{"clade.db", "clade.db-wal"} {
		if b, err := os.ReadFile(filepath.Join(d.DataDir, f)); err == nil && (bytes.Contains(b, []byte(key)) || bytes.Contains(b, raw)) {
			t.Fatalf("%s holds the given key in plaintext", f)
		}
	}
}
