package httpapi_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// counterScript starts a background Python process that counts in memory
// and publishes the count in /tmp/count, and waits until it has started.
const counterScript = `nohup python3 -c '
import os, time
i = 0
while True:
    i += 1
    open("/tmp/count.tmp", "w").write(str(i)); os.rename("/tmp/count.tmp", "/tmp/count")
    time.sleep(0.01)
' > /dev/null 2>&1 &
until [ -s /tmp/count ]; do sleep 0.01; done`

func readCount(t *testing.T, c *sdk.Client, id string) int {
	t.Helper()
	r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"cat", "/tmp/count"}})
	n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("count in %s: %+v", id, r)
	}
	return n
}

// waitCountPast waits until the counter in id is above n, proving the
// process runs (polling the sandbox, bounded).
func waitCountPast(t *testing.T, c *sdk.Client, id string, n int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if m := readCount(t, c, id); m > n {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: the counter process is not running (stuck at %d)", id, n)
		}
	}
}

func TestFork(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	// With the warm pool: children restore into prepared sandboxes.
	d := testenv.StartDaemon(t, "--warm-pool", "4")
	c := d.Client
	parent := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "parent", Env: []string{"ORIGIN=parent-env"}})
	if r := run(t, c, parent.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo parent-file > /root/f; " + counterScript}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	snap, err := c.SnapshotSandbox(t.Context(), parent.ID, "base")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	atSnap := readCount(t, c, parent.ID)

	res, err := c.Fork(t.Context(), "base", 3)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if res.Snapshot != snap.ID || len(res.Children) != 3 {
		t.Fatalf("fork result %+v", res)
	}
	var kids []string
	for _, ch := range res.Children {
		if ch.Error != "" || ch.ID == "" {
			t.Fatalf("child failed: %+v", ch)
		}
		kids = append(kids, ch.ID)
	}

	t.Run("children hold the parent's state", func(t *testing.T) {
		for _, id := range kids {
			r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; echo $ORIGIN"}})
			if r.stdout != "parent-file\nparent-env\n" {
				t.Fatalf("child %s: %+v", id, r)
			}
			n := readCount(t, c, id)
			if n < atSnap-200 { // the counter starts from where it was at the snapshot, not from zero
				t.Fatalf("child %s counter %d, parent's at the snapshot was about %d", id, n, atSnap)
			}
			waitCountPast(t, c, id, n)
		}
	})

	t.Run("isolation", func(t *testing.T) {
		for i, id := range kids {
			run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("echo mine-%d > /root/own; echo changed-%d > /root/f", i, i)}})
		}
		for i, id := range append([]string{parent.ID}, kids...) {
			r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; cat /root/own 2>/dev/null || echo none"}})
			want := "parent-file\nnone\n"
			if i > 0 {
				want = fmt.Sprintf("changed-%d\nmine-%d\n", i-1, i-1)
			}
			if r.stdout != want {
				t.Fatalf("sandbox %d (%s): %q, want %q", i, id, r.stdout, want)
			}
		}
		// Own hostname and entropy per child; a listener in one child is
		// not reachable from another (each has its own network stack).
		seen := map[string]bool{}
		for _, id := range append([]string{parent.ID}, kids...) {
			r := run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'"}})
			lines := strings.Split(r.stdout, "\n")
			if len(lines) != 2 || seen[lines[0]] || seen[lines[1]] || (id != parent.ID && lines[0] == "parent") {
				t.Fatalf("sandbox %s identity %q: hostname and entropy must be its own", id, r.stdout)
			}
			seen[lines[0]], seen[lines[1]] = true, true
			// /etc/hostname and /etc/hosts name it too: localhost and its
			// own name resolve without DNS.
			r = run(t, c, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /etc/hostname; getent hosts localhost " + lines[0]}})
			if want := lines[0] + "\n"; !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "localhost") || !strings.Contains(r.stdout, "127.0.1.1       "+lines[0]) {
				t.Fatalf("sandbox %s (hostname %s): /etc/hostname and getent said %q", id, lines[0], r.stdout)
			}
		}
		run(t, c, kids[0], sdk.ExecRequest{Cmd: []string{"sh", "-c", "nohup python3 -m http.server 8080 --bind 127.0.0.1 > /dev/null 2>&1 & until python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8080))' 2>/dev/null; do sleep 0.02; done"}})
		r := run(t, c, kids[1], sdk.ExecRequest{Cmd: []string{"python3", "-c", "import socket\ntry:\n  socket.create_connection(('127.0.0.1', 8080), timeout=2); print('reached')\nexcept OSError: print('isolated')"}})
		if r.stdout != "isolated\n" {
			t.Fatalf("child 1 reached child 0's listener: %+v", r)
		}
	})

	t.Run("clock", func(t *testing.T) {
		r := run(t, c, kids[0], sdk.ExecRequest{Cmd: []string{"date", "+%s"}})
		sec, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64)
		if d := time.Now().Unix() - sec; d > 5 || d < -5 {
			t.Fatalf("child clock %d, host %d", sec, time.Now().Unix())
		}
	})

	t.Run("snapshot refcount", func(t *testing.T) {
		err := c.DeleteSnapshot(t.Context(), "base")
		if !sdk.IsConflict(err) || !strings.Contains(err.Error(), kids[0]) {
			t.Fatalf("removing a snapshot in use: %v, want a conflict naming its users", err)
		}
		got, err := c.GetSnapshot(t.Context(), snap.ID)
		if err != nil || len(got.UsedBy) != 3 {
			t.Fatalf("snapshot users: %+v %v", got, err)
		}
		for _, id := range kids {
			if err := c.DeleteSandbox(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.DeleteSnapshot(t.Context(), "base"); err != nil {
			t.Fatalf("removing an unused snapshot: %v", err)
		}
		if _, err := c.GetSnapshot(t.Context(), "base"); !sdk.IsNotFound(err) {
			t.Fatalf("removed snapshot still there: %v", err)
		}
	})

	t.Run("fork a running sandbox", func(t *testing.T) {
		res, err := c.Fork(t.Context(), "parent", 2)
		if err != nil || len(res.Children) != 2 || res.Children[0].Error != "" || res.Children[1].Error != "" {
			t.Fatalf("fork of a sandbox: %+v %v", res, err)
		}
		snap, err := c.GetSnapshot(t.Context(), res.Snapshot)
		if err != nil || !snap.Implicit {
			t.Fatalf("implicit snapshot: %+v %v", snap, err)
		}
		// The parent keeps running and counting.
		waitCountPast(t, c, parent.ID, readCount(t, c, parent.ID))
		for _, ch := range res.Children {
			if err := c.DeleteSandbox(t.Context(), ch.ID); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.GetSnapshot(t.Context(), res.Snapshot); !sdk.IsNotFound(err) {
			t.Fatalf("the implicit snapshot outlived its children: %v", err)
		}
	})

	t.Run("create from snapshot", func(t *testing.T) {
		if _, err := c.SnapshotSandbox(t.Context(), parent.ID, "again"); err != nil {
			t.Fatal(err)
		}
		sb, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{FromSnapshot: "again", Name: "single"})
		if err != nil || sb.Name != "single" || sb.State != "running" {
			t.Fatalf("create --from: %+v %v", sb, err)
		}
		if r := run(t, c, "single", sdk.ExecRequest{Cmd: []string{"cat", "/root/f"}}); r.stdout != "parent-file\n" {
			t.Fatalf("single child: %+v", r)
		}
	})

	t.Run("errors", func(t *testing.T) {
		if _, err := c.Fork(t.Context(), "nothing-called-this", 1); !sdk.IsNotFound(err) {
			t.Errorf("fork of an unknown source: %v", err)
		}
		if _, err := c.Fork(t.Context(), "parent", 0); !sdk.IsInvalidArgument(err) {
			t.Errorf("fork n=0: %v", err)
		}
		if _, err := c.Fork(t.Context(), "parent", 100000); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "max") {
			t.Errorf("fork above the maximum: %v", err)
		}
		if _, err := c.SnapshotSandbox(t.Context(), "parent", "again"); !sdk.IsConflict(err) {
			t.Errorf("snapshot with a taken name: %v", err)
		}
	})
}

func TestForkAdmission(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t, "--max-fork", "8")
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{MemoryMiB: 4096})
	_, err := c.Fork(t.Context(), sb.ID, 8) // 8 x 4 GiB counted at their limits: more than this host has
	if err == nil || !sdk.IsUnavailable(err) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("fork beyond the memory floor: %v, want a 503 about memory", err)
	}
	snaps, _ := c.ListSnapshots(t.Context())
	sbs, _ := c.ListSandboxes(t.Context())
	if len(snaps) != 0 || len(sbs) != 1 {
		t.Fatalf("a refused fork left %d snapshots and %d sandboxes", len(snaps), len(sbs))
	}
}

func TestSleepWake(t *testing.T) {
	t.Parallel() // its subtests, a daemon each: see TestMain
	for _, pool := range []string{"0", "2"} {
		t.Run("warm-pool-"+pool, func(t *testing.T) {
			t.Parallel() // a daemon of its own: see TestMain
			testSleepWake(t, pool)
		})
	}
}

// waitWarm waits (bounded) until the daemon holds n prepared sandboxes.
func waitWarm(t *testing.T, c *sdk.Client, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Warm >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pool did not reach %d: %+v %v", n, h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pool's size
	}
}

func testSleepWake(t *testing.T, pool string) {
	d := testenv.StartDaemon(t, "--warm-pool", pool)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "sleepy"})
	run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f; " + counterScript}})
	before := readCount(t, c, sb.ID)
	slept, err := c.Sleep(t.Context(), "sleepy")
	if err != nil || slept.State != "sleeping" {
		t.Fatalf("sleep: %+v %v", slept, err)
	}
	// Its sandbox process is killed before the sleep answers; runsc's own
	// teardown (the gofer, runsc delete) finishes in the background.
	for deadline := time.Now().Add(30 * time.Second); ; {
		pids := testenv.ProcessesMentioning(sb.ID)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sleeping sandbox still has processes 30 s after its sleep: %v", pids)
		}
		time.Sleep(50 * time.Millisecond) // polling the process table
	}
	// Sleep survives a daemon crash.
	d.Kill()
	d.Start(nil)
	if got, err := c.GetSandbox(t.Context(), "sleepy"); err != nil || got.State != "sleeping" {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	woke, err := c.Wake(t.Context(), "sleepy")
	if err != nil || woke.State != "running" || woke.ID != sb.ID {
		t.Fatalf("wake: %+v %v", woke, err)
	}
	after := readCount(t, c, sb.ID)
	if after < before {
		t.Fatalf("counter went back from %d to %d: the process's memory was not kept", before, after)
	}
	waitCountPast(t, c, sb.ID, after)
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/f"}}); r.stdout != "kept\n" {
		t.Fatalf("file after wake: %+v", r)
	}
	// Exec wakes a sleeping sandbox by itself (with a pool: into a
	// prepared engine sandbox, kept ready after the first wake).
	if pool != "0" {
		waitWarm(t, c, 1)
	}
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/f"}}); r.err != nil || r.stdout != "kept\n" {
		t.Fatalf("exec on a sleeping sandbox: %+v", r)
	}
	// Removing a sleeping sandbox removes its image.
	if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotCrashPoints kills the daemon inside a fork, a sleep and a wake
// and checks that the restarted daemon shows only whole sandboxes and
// leaks nothing.
func TestSnapshotCrashPoints(t *testing.T) {
	t.Parallel() // its subtests, a daemon each: see TestMain
	for _, point := range []string{"snapshot-before-engine", "fork-mid-restore", "fork-after-children", "sleep-before-engine", "sleep-before-seal", "sleep-after-checkpoint", "sleep-before-reap", "wake-before-engine"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel() // a daemon of its own: see TestMain
			d := testenv.StartDaemon(t)
			c := d.Client
			sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
			run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/f"}})
			if point == "wake-before-engine" {
				if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			d.Kill()
			d.Start([]string{"CLADE_CRASH_AT=" + point})
			var err error
			switch {
			case strings.HasPrefix(point, "sleep"):
				_, err = c.Sleep(context.Background(), sb.ID)
			case strings.HasPrefix(point, "wake"):
				_, err = c.Wake(context.Background(), sb.ID)
			default:
				_, err = c.Fork(context.Background(), sb.ID, 3)
			}
			if err == nil {
				t.Fatal("the request succeeded; the daemon should have crashed in it")
			}
			_ = d.Wait()
			d.Start(nil)
			sbs, err := c.ListSandboxes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			ids := map[string]bool{}
			for _, s := range sbs {
				ids[s.ID] = true
				if s.State != "running" && s.State != "sleeping" {
					t.Fatalf("after restart %s is %s, want running or sleeping", s.ID, s.State)
				}
				// Every listed sandbox is whole: it answers (waking if asleep).
				testenv.AwaitExec(t, c, s.ID)
				if r := run(t, c, s.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/f"}}); r.stdout != "kept\n" {
					t.Fatalf("sandbox %s after restart: %+v\n%s", s.ID, r, d.Log())
				}
			}
			if !ids[sb.ID] {
				t.Fatalf("the original sandbox is gone after a crash in %s", point)
			}
			// A fork cut short answered nobody: none of its children is left.
			if strings.HasPrefix(point, "fork") && len(sbs) != 1 {
				t.Fatalf("after a crash in %s: sandboxes %+v, want only the parent (the fork's caller was told of no child)", point, sbs)
			}
			for _, s := range sbs {
				if s.ID != sb.ID {
					_ = c.DeleteSandbox(t.Context(), s.ID)
				}
			}
			// No implicit snapshot outlives its children; the cleanup then
			// checks that no file outlives its sandbox or snapshot.
			snaps, _ := c.ListSnapshots(t.Context())
			for _, sn := range snaps {
				if sn.Implicit && len(sn.UsedBy) == 0 {
					t.Fatalf("an unused implicit snapshot survived: %+v", sn)
				}
			}
		})
	}
}
