package volume_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestVolumeSnapshotDaemonKill kills the daemon (SIGKILL, at a named point:
// CLADE_CRASH_AT) while a snapshot of a sandbox with a volume has it
// stopped, and checks what the next daemon makes of it. With a sealed
// checkpoint the sandbox is back running, in place: the same process, its
// memory and its volume as they were, the volume writable (a copy cut
// short held it frozen). With an unsealed one it is stopped saying why,
// its volume intact. Restored already (the daemon died before recording
// the snapshot ready), it is kept as it runs. Either way the half-made
// snapshot is gone, files and mounts included.
func TestVolumeSnapshotDaemonKill(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	for _, tc := range []struct {
		point    string
		restored bool
		// log is what the restarted daemon says it did.
		log  string
		args []string
		// encVol: the volume has a key of its own (volume create --encrypt).
		encVol bool
	}{
		// Killed after the checkpoint, before its seal: the engine had not
		// stopped the sandbox yet, so it runs on.
		{"snapshot-before-engine", true, "reconcile: reattached", nil, false},
		// Killed while the checkpoint runs, the sandbox paused for it.
		{"gvisor-checkpoint-sent", true, "reconcile: reattached", nil, false},
		{"snapshot-before-seal", true, "reconcile: reattached", nil, false},
		{"snapshot-stopped", true, "restored it in place", nil, false},
		{"volume-copy-frozen", true, "restored it in place", nil, false},
		{"snapshot-before-restore", true, "restored it in place", nil, false},
		// Killed while the restore in place runs.
		{"gvisor-restore-started", true, "restored it in place", nil, false},
		// The restore had booted: the next daemon either finds it
		// running and reattaches, or restores again, by whether the
		// engine's record of it was written before the kill.
		{"gvisor-restore-booted", true, "restored it in place|reconcile: reattached", nil, false},
		{"snapshot-before-ready", true, "reattached a sandbox restored after its snapshot", nil, false},
		// The encrypted view outlives the killed daemon; the next one
		// mounts it again and restores from it.
		{"volume-copy-frozen", true, "restored it in place", []string{"--encrypt-at-rest"}, false},
		// Killed while the copy of an encrypted volume's gocryptfs dir runs,
		// its file system frozen on the plain view.
		{"volume-copy-frozen", true, "restored it in place", nil, true},
	} {
		name := tc.point
		if tc.encVol {
			name += "/encrypted-volume"
		}
		if len(tc.args) > 0 || tc.encVol {
			if len(tc.args) > 0 {
				name += "/encrypted"
			}
			if _, err := exec.LookPath("gocryptfs"); err != nil {
				t.Logf("skipping %s: gocryptfs is not installed (make deps)", name)
				continue
			}
		}
		t.Run(name, func(t *testing.T) {
			// Two points at a time (go test's -parallel): each has a daemon
			// of its own, and much of a point is waiting (the killed
			// daemon's restart, the agent's dialling back in).
			t.Parallel()
			d := testenv.StartDaemon(t, tc.args...)
			c := d.Client
			if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "db", SizeBytes: 64 << 20, Encrypt: tc.encVol}); err != nil {
				t.Fatal(err)
			}
			sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "db", Path: "/data"}}})
			// A process whose memory holds what it wrote, and its file
			// on the volume.
			mustSh(t, c, sb.ID, "dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null; md5sum /data/blob > /tmp/sum; "+
				"nohup sh -c 'm=in-memory-$$; while :; do sleep 1; done' > /dev/null 2>&1 & echo $! > /tmp/pid; sync")
			pid := strings.TrimSpace(mustSh(t, c, sb.ID, "cat /tmp/pid"))
			sum := mustSh(t, c, sb.ID, "md5sum /data/blob")

			d.Kill()
			d.Start([]string{"CLADE_CRASH_AT=" + tc.point})
			if _, err := c.SnapshotSandbox(t.Context(), sb.ID, "cut"); err == nil {
				t.Fatal("the snapshot succeeded; the daemon should have crashed in it")
			}
			_ = d.Wait()
			d.Start(nil)

			got, err := c.GetSandbox(t.Context(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if log := d.Log(); !slices.ContainsFunc(strings.Split(tc.log, "|"), func(s string) bool { return strings.Contains(log, s) }) {
				t.Errorf("the restarted daemon's log does not say %q", tc.log)
			}
			if snaps, err := c.ListSnapshots(t.Context()); err != nil || len(snaps) != 0 {
				t.Fatalf("snapshots after the restart: %+v %v, want the half-made one gone", snaps, err)
			}
			state := d.DataDir // where snapshots and volumes live
			if len(tc.args) > 0 {
				state = filepath.Join(d.DataDir, "plain")
			}
			for _, dir := range []string{filepath.Join(state, "snapshots"), filepath.Join(state, "volumes", "snapshots")} {
				if _, err := os.Stat(dir); err != nil {
					t.Fatalf("%s: %v: the check looks in the wrong place", dir, err)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Fatalf("%s holds %d entries after the restart: the half-made snapshot's files leaked", dir, len(ents))
				}
			}
			if tc.restored {
				if got.State != "running" {
					t.Fatalf("after the restart the sandbox is %s (%s), want running: its checkpoint was sealed\n%s", got.State, got.Error, d.Log())
				}
				testenv.AwaitExec(t, c, sb.ID)
				// The same process, in memory; the volume as it was, and
				// writable (timeout: a frozen file system would hang).
				if out := mustSh(t, c, sb.ID, "kill -0 "+pid+" && cat /tmp/sum"); out != sum {
					t.Fatalf("after the restart: %q, want the process alive and its memory's file %q", out, sum)
				}
				if out := mustSh(t, c, sb.ID, "md5sum /data/blob; timeout 20 sh -c 'echo after > /data/g && sync' && cat /data/g"); out != sum+"after\n" {
					t.Fatalf("the volume after the restart: %q, want %q and writable", out, sum+"after\n")
				}
				// Snapshots work again.
				if _, err := c.SnapshotSandbox(t.Context(), sb.ID, ""); err != nil {
					t.Fatalf("snapshot after the restart: %v", err)
				}
				if out := mustSh(t, c, sb.ID, "kill -0 "+pid+" && cat /data/g"); out != "after\n" {
					t.Fatalf("after a second snapshot: %q", out)
				}
			} else {
				if got.State != "stopped" || !strings.Contains(got.Error, "never sealed") || !strings.Contains(got.Error, "volumes are intact") {
					t.Fatalf("after the restart the sandbox is %s (%q), want stopped saying its checkpoint was never sealed", got.State, got.Error)
				}
			}
			if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			snaps, _ := c.ListSnapshots(t.Context())
			for _, sn := range snaps {
				if err := c.DeleteSnapshot(t.Context(), sn.ID); err != nil {
					t.Fatal(err)
				}
			}
			// Nothing was lost: the volume holds what the sandbox wrote.
			sb2 := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "db", Path: "/data"}}})
			if out := mustSh(t, c, sb2.ID, "md5sum /data/blob"); out != sum {
				t.Fatalf("the volume in a new sandbox: %q, want %q", out, sum)
			}
			if err := c.DeleteSandbox(t.Context(), sb2.ID); err != nil {
				t.Fatal(err)
			}
			for _, sub := range []string{"sandboxes", "snapshots", "mnt"} {
				if ents, _ := os.ReadDir(filepath.Join(state, "volumes", sub)); len(ents) != 0 {
					t.Errorf("volumes/%s holds %d entries after every user is gone", sub, len(ents))
				}
			}
			if len(tc.args) > 0 {
				// The encrypted view is the daemon's while it runs: the
				// census is of what outlives it.
				d.Stop()
			}
			if leaks := testenv.Leaks(d.DataDir); len(leaks) > 0 {
				t.Fatalf("leaks: %v\n%s", leaks, d.Log())
			}
		})
	}
}

// TestVolumeSnapshotKilledAnywhere SIGKILLs the daemon at moments spread
// over the snapshot of a sandbox with a volume (which stops the sandbox
// for the volume's copy), not only at the named points: after every
// restart the sandbox is running again, the same process in it, its
// volume intact and writable.
func TestVolumeSnapshotKilledAnywhere(t *testing.T) {
	testenv.Slow(t)
	d := testenv.StartDaemon(t)
	c := d.Client
	if _, err := c.CreateVolume(t.Context(), sdk.CreateVolumeRequest{Name: "db", SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	sb := create(t, c, sdk.CreateSandboxRequest{Volumes: []sdk.VolumeMount{{Name: "db", Path: "/data"}}})
	mustSh(t, c, sb.ID, "dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null; "+
		"nohup sh -c 'while :; do sleep 1; done' > /dev/null 2>&1 & echo $! > /tmp/pid; sync")
	pid := strings.TrimSpace(mustSh(t, c, sb.ID, "cat /tmp/pid"))
	sum := mustSh(t, c, sb.ID, "md5sum /data/blob")

	// How long a whole snapshot takes here.
	t0 := time.Now()
	sn, err := c.SnapshotSandbox(t.Context(), sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if err := c.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	const kills = 6
	for i := range kills {
		delay := took * time.Duration(i) / (kills - 1)
		done := make(chan error, 1)
		go func() {
			_, err := c.SnapshotSandbox(context.WithoutCancel(t.Context()), sb.ID, "")
			done <- err
		}()
		time.Sleep(delay) // the moment of the kill, not a synchronisation
		d.Kill()
		serr := <-done
		t.Logf("killed %v into a snapshot (a whole one takes %v): %v", delay, took, serr)
		d.Start(nil)
		got, err := c.GetSandbox(t.Context(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "running" {
			t.Fatalf("killed %v into a snapshot (of %v): the sandbox is %s (%s), want running\n%s", delay, took, got.State, got.Error, d.Log())
		}
		testenv.AwaitExec(t, c, sb.ID)
		if out := mustSh(t, c, sb.ID, "kill -0 "+pid+" && md5sum /data/blob"); out != sum {
			t.Fatalf("killed %v into a snapshot: %q, want the process alive and the volume's file %q", delay, out, sum)
		}
		if out := mustSh(t, c, sb.ID, "timeout 20 sh -c 'echo "+strconv.Itoa(i)+" > /data/g && sync' && cat /data/g"); out != strconv.Itoa(i)+"\n" {
			t.Fatalf("killed %v into a snapshot: the volume is not writable: %q", delay, out)
		}
		// A snapshot the kill came too late for is whole: it goes, so
		// that the next round starts alike.
		snaps, err := c.ListSnapshots(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range snaps {
			if err := c.DeleteSnapshot(t.Context(), sn.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
}
