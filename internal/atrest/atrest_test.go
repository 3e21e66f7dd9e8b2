package atrest_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

func sh(t *testing.T, c *sdk.Client, id, cmd string) string {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", cmd}, Stdout: &out, Stderr: &errb})
	if err != nil || st.Code != 0 {
		t.Fatalf("%q in %s: %v %+v %s", cmd, id, err, st, errb.String())
	}
	return out.String()
}

func marker(what string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "clade-" + what + "-" + hex.EncodeToString(b)
}

// scan returns the markers found in the raw bytes of every file under
// root, except under skip, and of every deleted file under root that a
// process still holds open (a running sandbox's upper layer is one).
func scan(t *testing.T, root, skip string, markers []string) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	look := func(name string, b []byte) {
		for _, m := range markers {
			if bytes.Contains(b, []byte(m)) {
				found[m] = append(found[m], name)
			}
		}
	}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && skip != "" && p == skip {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			if b, err := os.ReadFile(p); err == nil {
				look(p, b)
			}
		}
		return nil
	})
	procs, _ := os.ReadDir("/proc")
	for _, pr := range procs {
		fds, _ := os.ReadDir(filepath.Join("/proc", pr.Name(), "fd"))
		for _, fd := range fds {
			p := filepath.Join("/proc", pr.Name(), "fd", fd.Name())
			target, err := os.Readlink(p)
			if err != nil || !strings.HasPrefix(target, root+"/") || !strings.HasSuffix(target, " (deleted)") {
				continue
			}
			if skip != "" && strings.HasPrefix(target, skip+"/") {
				continue
			}
			if b, err := os.ReadFile(p); err == nil {
				look(p+" -> "+target, b)
			}
		}
	}
	return found
}

// TestEncryptAtRest: with --encrypt-at-rest, markers placed in a
// sandbox's memory, in a file it wrote, in a volume and in a secret are
// nowhere in the raw bytes under the data dir after a snapshot, a fork
// and a sleep, while the plain view (the check that the scan can find
// them) holds them.
func TestEncryptAtRest(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	d := testenv.StartDaemon(t, "--encrypt-at-rest")
	c := d.Client
	mem, file, vol, sec := marker("mem"), marker("file"), marker("vol"), marker("secret")
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "v", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetSecret(t.Context(), "s", []byte(sec)); err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: "/data"}},
		Secrets: []sdk.SecretRef{{Name: "s", File: "/run/secrets/s"}}})
	if err != nil {
		t.Fatal(err)
	}
	half := len(mem) / 2
	// The memory marker is put together at run time: only memory holds it whole.
	sh(t, c, sb.ID, "echo "+file+" > /root/f; echo "+vol+" > /data/f; sync; grep -q "+sec[:8]+" /run/secrets/s; "+
		"nohup python3 -c 'import sys, time; x = [sys.argv[1] + sys.argv[2] for _ in range(64)]; open(\"/tmp/up\", \"w\").close(); time.sleep(100000)' "+
		mem[:half]+" "+mem[half:]+" > /dev/null 2>&1 & until [ -e /tmp/up ]; do sleep 0.01; done")
	snap, err := c.SnapshotSandbox(t.Context(), sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(t.Context(), snap.ID, 1)
	if err != nil || res.Children[0].Error != "" {
		t.Fatalf("fork: %v %+v", err, res)
	}
	if got := sh(t, c, res.Children[0].ID, "cat /root/f /data/f"); got != file+"\n"+vol+"\n" {
		t.Fatalf("the child reads %q", got)
	}
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	markers := []string{mem, file, vol, sec}
	plain := filepath.Join(d.DataDir, "plain")
	inPlain := scan(t, plain, "", markers)
	for _, m := range []string{mem, vol} {
		if len(inPlain[m]) == 0 {
			t.Fatalf("the plain view does not hold %s: the scan cannot tell", m)
		}
	}
	for m, where := range scan(t, d.DataDir, plain, markers) {
		t.Errorf("marker %s is in plaintext on disk: %v", m, where)
	}
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, c, sb.ID, "cat /root/f /data/f /run/secrets/s"); got != file+"\n"+vol+"\n"+sec {
		t.Fatalf("after the wake: %q", got)
	}
}
