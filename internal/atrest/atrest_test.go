package atrest_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	mem, file, vol, sec, envSec := marker("mem"), marker("file"), marker("vol"), marker("secret"), marker("envsecret")
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "v", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetSecret(t.Context(), "s", []byte(sec)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetSecret(t.Context(), "e", []byte(envSec)); err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: "/data"}},
		Secrets: []sdk.SecretRef{{Name: "s", File: "/run/secrets/s"}, {Name: "e", Env: "E_SECRET"}}})
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
	if got := sh(t, c, res.Children[0].ID, "cat /root/f /data/f; env | grep ^E_SECRET="); got != file+"\n"+vol+"\nE_SECRET="+envSec+"\n" {
		t.Fatalf("the child reads %q", got)
	}
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	markers := []string{mem, file, vol, sec, envSec}
	plain := filepath.Join(d.DataDir, "plain")
	inPlain := testenv.FindMarkers(plain, "", markers)
	for _, m := range []string{mem, vol, envSec} {
		if len(inPlain[m]) == 0 {
			t.Fatalf("the plain view does not hold %s: the scan cannot tell", m)
		}
	}
	for m, where := range testenv.FindMarkers(d.DataDir, plain, markers) {
		t.Errorf("marker %s is in plaintext on disk: %v", m, where)
	}
	if _, err := c.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, c, sb.ID, "cat /root/f /data/f /run/secrets/s; echo; echo $E_SECRET"); got != file+"\n"+vol+"\n"+sec+"\n"+envSec+"\n" {
		t.Fatalf("after the wake: %q", got)
	}
	// Running again (its upper layer an open deleted file, its bundle and
	// runsc's state in place): still nowhere in plaintext.
	for m, where := range testenv.FindMarkers(d.DataDir, plain, markers) {
		t.Errorf("after the wake, marker %s is in plaintext on disk: %v", m, where)
	}
}

// TestAtRestModeKept: a data dir whose state is encrypted refuses a daemon
// started without --encrypt-at-rest, and one whose state is plaintext
// refuses a daemon started with it, both saying what to do and changing
// nothing: started again as before, the sleeping sandbox wakes with its
// volume and the snapshot is still there. (Started the other way, a daemon
// found none of that state and dropped its records.)
func TestAtRestModeKept(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	for _, tc := range []struct {
		name        string
		first, then []string
		want        string
	}{
		{"encrypted then plain", []string{"--encrypt-at-rest"}, nil, "start the daemon with --encrypt-at-rest"},
		{"plain then encrypted", nil, []string{"--encrypt-at-rest"}, "start the daemon without it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testenv.StartDaemon(t, tc.first...)
			c := d.Client
			mark := marker("mode")
			if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "v", SizeBytes: 32 << 20}); err != nil {
				t.Fatal(err)
			}
			sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "v", Path: "/data"}}})
			if err != nil {
				t.Fatal(err)
			}
			sh(t, c, sb.ID, "echo "+mark+" > /data/f")
			snap, err := c.SnapshotSandbox(t.Context(), sb.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			d.Stop()

			_, agent := testenv.Binaries(t)
			args := append([]string{"daemon", "--data-dir", d.DataDir, "--socket", filepath.Join(filepath.Dir(d.Socket), "other.sock"),
				"--build-default-image=false", "--images-dir", testenv.ImagesDir(t), "--runsc", testenv.Runsc(t), "--agent", agent, "--warm-pool", "0", "--hot-pool", "0", "--dns-upstream", "none"},
				append(d.Net.DaemonArgs(), tc.then...)...)
			other := exec.Command(d.Bin, args...)
			var out bytes.Buffer
			other.Stdout, other.Stderr = &out, &out
			if err := other.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- other.Wait() }()
			oc, err := sdk.New(filepath.Join(filepath.Dir(d.Socket), "other.sock"))
			if err != nil {
				t.Fatal(err)
			}
			var werr error
		wait:
			for deadline := time.Now().Add(60 * time.Second); ; {
				select {
				case werr = <-exited:
					break wait
				case <-time.After(50 * time.Millisecond): // polling the socket while it starts
				}
				if _, err := oc.Health(t.Context()); err == nil || time.Now().After(deadline) {
					_ = other.Process.Signal(syscall.SIGTERM)
					werr = <-exited
					t.Errorf("a daemon started %v on a data dir made %v started (%v): %s", tc.then, tc.first, werr, out.String())
					break wait
				}
			}
			if werr == nil || !strings.Contains(out.String(), tc.want) {
				t.Errorf("the daemon started the other way: %v: %s, want %q", werr, out.String(), tc.want)
			}

			d.Start(nil)
			if _, err := c.GetSnapshot(t.Context(), snap.ID); err != nil {
				t.Errorf("the snapshot after the refused start: %v", err)
			}
			if _, err := c.Wake(t.Context(), sb.ID); err != nil {
				t.Fatalf("wake after the refused start: %v", err)
			}
			if got := sh(t, c, sb.ID, "cat /data/f"); got != mark+"\n" {
				t.Fatalf("the volume after the refused start holds %q", got)
			}
		})
	}
}
