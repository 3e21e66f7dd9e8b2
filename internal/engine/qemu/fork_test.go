//go:build qemu

package qemu_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// smaps returns a process's private and proportional memory in KiB.
func smaps(t *testing.T, pid int) (private, pss int) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		switch k {
		case "Private_Clean", "Private_Dirty":
			private += n
		case "Pss":
			pss = n
		}
	}
	return private, pss
}

// procStatus is the value of key in /proc/PID/status.
func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, key)
	return ""
}

// TestForkSharesMemory forks N children (CLADE_QEMU_FORKS, default 8) from
// one checkpoint of a 512 MiB guest that touched 64 MiB: each child maps the
// checkpoint's memory file privately, so what it holds of its own (its
// QEMU's private memory) stays far below what the guest touched, and every
// child still has the parent's data and its own writes.
func TestForkSharesMemory(t *testing.T) {
	n := 8
	if v, err := strconv.Atoi(os.Getenv("CLADE_QEMU_FORKS")); err == nil && v > 0 {
		n = v
	}
	dir := testenv.TempDir(t)
	e := newEngine(t, dir)
	t.Cleanup(func() { assertNoLeaks(t, e, dir) })
	ctx := t.Context()
	spec := engine.Spec{ID: "forkparent000001", RootFS: rootFS(t), MemoryMiB: 512, Hostname: "parent"}
	t0 := time.Now()
	parent, err := e.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	boot := time.Since(t0)
	t.Cleanup(func() { _ = e.Destroy(context.Background(), spec.ID) })
	t0 = time.Now()
	r := enginetest.Exec(t, parent, "true")
	execTime := time.Since(t0)
	// 64 MiB of non-zero data in guest RAM, held by a process that runs on
	// (a pattern: os.urandom of 64 MiB under TCG takes minutes on a loaded
	// host, and the host does not merge equal pages). Python's start alone
	// can take a minute there: execLong.
	r = execLong(t, parent, "sh", "-c", `python3 -c '
import sys
b = bytearray(range(256)) * (256 << 10)
open("/tmp/ready", "w").write("1")
sys.stdout.close()
import time
while True: time.sleep(60)
' > /dev/null 2>&1 &
until [ -s /tmp/ready ]; do sleep 0.1; done; echo ok`)
	if r.Stdout != "ok\n" {
		t.Fatalf("touch 64 MiB: %+v", r)
	}
	snap := filepath.Join(dir, "snap")
	t0 = time.Now()
	if err := e.Checkpoint(ctx, spec.ID, snap, true); err != nil {
		t.Fatal(err)
	}
	ckpt := time.Since(t0)
	ppriv, _ := smaps(t, parent.PID())

	var avail0 = memAvailable(t)
	kids := make([]engine.Sandbox, n)
	errs := make([]error, n)
	t0 = time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("forkchild%07d", i)
			kids[i], errs[i] = e.Restore(ctx, engine.Spec{ID: id, RootFS: rootFS(t), MemoryMiB: 512, Hostname: id}, snap)
		}()
	}
	wg.Wait()
	fork := time.Since(t0)
	for i := range n {
		id := fmt.Sprintf("forkchild%07d", i)
		t.Cleanup(func() { _ = e.Destroy(context.Background(), id) })
		if errs[i] != nil {
			t.Fatalf("child %d: %v", i, errs[i])
		}
	}
	availDelta := (avail0 - memAvailable(t)) / n
	var privs, psss []int
	for i, k := range kids {
		if err := k.Guest().Reconfigure(ctx, guest.Config{Hostname: k.ID()}); err != nil {
			t.Fatal(err)
		}
		r := enginetest.Exec(t, k, "sh", "-c", fmt.Sprintf("hostname; test -s /tmp/ready && echo ready; echo child-%d > /root/own; cat /root/own", i))
		want := fmt.Sprintf("%s\nready\nchild-%d\n", k.ID(), i)
		if r.Stdout != want {
			t.Fatalf("child %d: %+v, want %q", i, r, want)
		}
		p, s := smaps(t, k.PID())
		privs, psss = append(privs, p>>10), append(psss, s>>10)
		// Started through the no-THP launcher: no 2 MiB page of its own
		// for a few bytes of its translation cache or firmware.
		if v := procStatus(t, k.PID(), "THP_enabled"); v != "0" {
			t.Errorf("child %d's QEMU has THP_enabled %q, want 0", i, v)
		}
	}
	t.Logf("boot %v, exec %v, checkpoint (leave running, 512 MiB guest, 64 MiB touched) %v, parent private %d MiB", boot.Round(time.Millisecond), execTime.Round(time.Millisecond), ckpt.Round(time.Millisecond), ppriv>>10)
	t.Logf("fork %d: %v to all answering; per child private MiB %v, PSS MiB %v, MemAvailable drop per child %d MiB", n, fork.Round(time.Millisecond), privs, psss, availDelta>>10)
	logTopMappings(t, kids[len(kids)-1].PID())
	for i, p := range privs {
		if p > 64 {
			t.Errorf("child %d holds %d MiB of its own: more than the 64 MiB its parent touched; the memory file is not shared", i, p)
		}
	}
}

// memAvailable is /proc/meminfo's MemAvailable in KiB.
func memAvailable(t *testing.T) int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// TestCheckpointRestoredVM: a VM restored from a snapshot maps the
// snapshot's memory privately, so its own checkpoint (a forked child put to
// sleep) carries its RAM in the migration stream; waking it brings back its
// writes and its processes.
func TestCheckpointRestoredVM(t *testing.T) {
	dir := testenv.TempDir(t)
	e := newEngine(t, dir)
	t.Cleanup(func() { assertNoLeaks(t, e, dir) })
	ctx := t.Context()
	spec := engine.Spec{ID: "streamparent0001", RootFS: rootFS(t), MemoryMiB: 256, Hostname: "parent"}
	parent, err := e.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destroy(context.Background(), spec.ID) })
	enginetest.Exec(t, parent, "sh", "-c", "echo from-parent > /root/f")
	snap := filepath.Join(dir, "snap")
	if err := e.Checkpoint(ctx, spec.ID, snap, true); err != nil {
		t.Fatal(err)
	}
	kid := engine.Spec{ID: "streamchild00001", RootFS: rootFS(t), MemoryMiB: 256, Hostname: "kid"}
	sb, err := e.Restore(ctx, kid, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destroy(context.Background(), kid.ID) })
	enginetest.Exec(t, sb, "sh", "-c", "echo from-kid >> /root/f; sh -c 'echo $$ > /root/bg.pid; exec sleep infinity' > /dev/null 2>&1 & until [ -s /root/bg.pid ]; do sleep 0.01; done")
	sleep := filepath.Join(dir, "sleep")
	if err := e.Checkpoint(ctx, kid.ID, sleep, false); err != nil {
		t.Fatal(err)
	}
	if e.IsCheckpoint(sleep) && fileExists(filepath.Join(sleep, "mem")) {
		t.Fatal("a restored VM's checkpoint has a memory file: its RAM is not a shared file to copy")
	}
	if err := e.Destroy(ctx, kid.ID); err != nil {
		t.Fatal(err)
	}
	woke, err := e.Restore(ctx, kid, sleep)
	if err != nil {
		t.Fatalf("wake: %v", err)
	}
	if r := enginetest.Exec(t, woke, "sh", "-c", "cat /root/f; kill -0 $(cat /root/bg.pid) && echo alive"); r.Stdout != "from-parent\nfrom-kid\nalive\n" {
		t.Fatalf("after wake: %+v", r)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// logTopMappings logs a process's mappings holding the most private memory.
func logTopMappings(t *testing.T, pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return
	}
	type m struct {
		name string
		kib  int
	}
	var all []m
	var cur *m
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			all = append(all, m{name: strings.Join(f[5:], " ") + " " + f[0]})
			cur = &all[len(all)-1]
			continue
		}
		if cur != nil && len(f) >= 2 && (f[0] == "Private_Dirty:" || f[0] == "Private_Clean:") {
			n, _ := strconv.Atoi(f[1])
			cur.kib += n
		}
	}
	slices.SortFunc(all, func(a, b m) int { return b.kib - a.kib })
	for _, x := range all[:min(6, len(all))] {
		t.Logf("child %d private %6d KiB in %s", pid, x.kib, x.name)
	}
}
