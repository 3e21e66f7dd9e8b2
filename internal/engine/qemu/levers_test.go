//go:build qemu

package qemu_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
	"github.com/clade-sandbox/clade/internal/engine/qemu"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// lever is an engine setting TestForkLevers compares.
type lever struct {
	cfg func(*qemu.Config)
	eng func(*qemu.Engine)
	// par bounds the restores that run at once (0: all N), as the
	// daemon's --restore-parallel does.
	par int
}

var forkLevers = map[string]lever{
	"tb16": {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 16 }},
	"tb12": {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 12 }},
	// THP as the host has it (QEMU started without the no-THP launcher).
	"tb16thp":  {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 16 }, eng: func(e *qemu.Engine) { e.SetTHP(true) }},
	"tb12thp":  {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 12 }, eng: func(e *qemu.Engine) { e.SetTHP(true) }},
	"old":      {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 16 }, eng: func(e *qemu.Engine) { e.SetHelloWait(time.Second) }},
	"new":      {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 8 }},
	"tb8":      {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 8 }},
	"tb4":      {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 4 }},
	"wait1":    {eng: func(e *qemu.Engine) { e.SetHelloWait(time.Second) }},
	"wait5":    {eng: func(e *qemu.Engine) { e.SetHelloWait(5 * time.Second) }},
	"tb8wait5": {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 8 }, eng: func(e *qemu.Engine) { e.SetHelloWait(5 * time.Second) }},
	"newpar4":  {cfg: func(c *qemu.Config) { c.TCGCacheMiB = 8 }, par: 4},
	// The links' nudge off: a restored agent waits out its second for
	// the old host's hang-up before it says hello.
	"nonudge": {eng: func(e *qemu.Engine) { e.SetNudge(false) }},
	"nudge":   {},
	// 4 and 8 restores at a time (4: the daemon's default on two cores).
	"nudgepar4":   {par: 4},
	"nudgepar8":   {par: 8},
	"nonudgepar4": {eng: func(e *qemu.Engine) { e.SetNudge(false) }, par: 4},
}

// TestForkLevers measures fork N (CLADE_QEMU_FORKS, default 16) of one
// checkpoint of a 512 MiB guest that touched 64 MiB under each engine
// setting named in CLADE_QEMU_LEVERS (comma-separated keys of forkLevers),
// CLADE_QEMU_ROUNDS rounds (default 3) in alternating order, all in one
// run so that the machine's load weighs on each alike. It logs medians of
// the time to all children answering, each child's CPU time, its private
// memory and PSS. A measurement, not a gate: it is skipped unless
// CLADE_QEMU_LEVERS is set.
func TestForkLevers(t *testing.T) {
	names := strings.Split(os.Getenv("CLADE_QEMU_LEVERS"), ",")
	if names[0] == "" {
		t.Skip("set CLADE_QEMU_LEVERS, e.g. tb16,tb8")
	}
	for _, n := range names {
		if _, ok := forkLevers[n]; !ok {
			lv, err := wrapLever(t, n)
			if err != nil {
				t.Fatal(err)
			}
			forkLevers[n] = lv
		}
	}
	n, rounds := 16, 3
	if v, err := strconv.Atoi(os.Getenv("CLADE_QEMU_FORKS")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("CLADE_QEMU_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	dir := testenv.TempDir(t)
	e := newEngine(t, dir)
	t.Cleanup(func() { assertNoLeaks(t, e, dir) })
	ctx := t.Context()
	spec := engine.Spec{ID: "leverparent00001", RootFS: rootFS(t), MemoryMiB: 512, Hostname: "parent"}
	parent, err := e.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destroy(context.Background(), spec.ID) })
	// 64 MiB of non-zero data held by a process that runs on (a pattern:
	// os.urandom is slow under TCG, and the host does not merge pages).
	r := execLong(t, parent, "sh", "-c", `python3 -c '
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
	if err := e.Checkpoint(ctx, spec.ID, snap, true); err != nil {
		t.Fatal(err)
	}
	type sample struct{ forkMS, cpuMS, recMS, execMS, priv, pss, priv2, pss1, steadyMS, pss2 []int }
	res := map[string]*sample{}
	for round := range rounds {
		order := slices.Clone(names)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			s := res[name]
			if s == nil {
				s = &sample{}
				res[name] = s
			}
			ldir := testenv.TempDir(t)
			_, agent := testenv.Binaries(t)
			cfg := qemu.Config{StateDir: ldir, AgentPath: agent, Log: logger(), ReadyTimeout: 3 * time.Minute}
			lv := forkLevers[name]
			if lv.cfg != nil {
				lv.cfg(&cfg)
			}
			le, err := qemu.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if lv.eng != nil {
				lv.eng(le)
			}
			t.Cleanup(func() { assertNoLeaks(t, le, ldir) })
			// The accelerator probe runs once per engine, before the timing
			// (a daemon's engine has long done it).
			if err := le.Warm(ctx, rootFS(t)); err != nil {
				t.Fatal(err)
			}
			kids := make([]engine.Sandbox, n)
			errs := make([]error, n)
			load := loadAvg()
			par := lv.par
			if par == 0 {
				par = n
			}
			sem := make(chan struct{}, par)
			t0 := time.Now()
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					id := fmt.Sprintf("lever%s%02d%02d", name, round, i)
					t.Cleanup(func() { _ = le.Destroy(context.Background(), id) })
					kids[i], errs[i] = le.Restore(ctx, engine.Spec{ID: id, RootFS: rootFS(t), MemoryMiB: 512, Hostname: id}, snap)
				}()
			}
			wg.Wait()
			s.forkMS = append(s.forkMS, int(time.Since(t0).Milliseconds()))
			for i := range n {
				if errs[i] != nil {
					t.Errorf("%s child %d: %v", name, i, errs[i])
				}
			}
			for _, k := range kids {
				if k == nil {
					continue
				}
				s.cpuMS = append(s.cpuMS, cpuMS(t, k.PID()))
				p, ps := smaps(t, k.PID())
				s.priv, s.pss = append(s.priv, p>>10), append(s.pss, ps>>10)
			}
			// Every child runs one command, as the bench's memfork does.
			var ewg sync.WaitGroup
			for _, k := range kids {
				if k == nil {
					continue
				}
				ewg.Add(1)
				go func() {
					defer ewg.Done()
					enginetest.Exec(t, k, "sh", "-c", "cat /proc/meminfo > /dev/null; ls / > /dev/null")
				}()
			}
			ewg.Wait()
			for _, k := range kids {
				if k != nil {
					_, ps := smaps(t, k.PID())
					s.pss1 = append(s.pss1, ps>>10)
				}
			}
			// Two children then run ten varied commands each: a cache
			// too small for the guest's working set shows as slow execs.
			for _, k := range kids[:min(2, n)] {
				if k == nil {
					continue
				}
				var ms []int
				for j := range 10 {
					t1 := time.Now()
					cmds := []string{"ls -la /usr/bin > /dev/null", "cat /proc/meminfo > /dev/null", "ps > /dev/null 2>&1; true", "sort /etc/passwd > /dev/null", "df / > /dev/null"}
					enginetest.Exec(t, k, "sh", "-c", cmds[j%len(cmds)])
					ms = append(ms, int(time.Since(t1).Milliseconds()))
				}
				s.steadyMS = append(s.steadyMS, median(ms))
				_, ps := smaps(t, k.PID())
				s.pss2 = append(s.pss2, ps>>10)
			}
			// Two children answer an exec with the parent's state (the
			// rest only cost time under TCG).
			for i, k := range kids[:min(2, n)] {
				if k == nil {
					continue
				}
				t1 := time.Now()
				// A second identity round trip: the first (the restore's)
				// paid for cold code; this one shows the link's own cost.
				if err := k.Guest().Reconfigure(ctx, guest.Config{Hostname: k.ID()}); err != nil {
					t.Error(err)
				}
				s.recMS = append(s.recMS, int(time.Since(t1).Milliseconds()))
				t1 = time.Now()
				if r := enginetest.Exec(t, k, "sh", "-c", "test -s /tmp/ready && hostname"); r.Stdout != fmt.Sprintf("lever%s%02d%02d\n", name, round, i) && r.Stdout != "parent\n" {
					t.Errorf("%s child %d: %+v", name, i, r)
				}
				s.execMS = append(s.execMS, int(time.Since(t1).Milliseconds()))
				p, _ := smaps(t, k.PID())
				s.priv2 = append(s.priv2, p>>10)
			}
			t.Logf("round %d %s: fork %d in %d ms (load %s)", round, name, n, s.forkMS[len(s.forkMS)-1], load)
			for _, k := range kids {
				if k != nil {
					_ = le.Destroy(context.Background(), k.ID())
				}
			}
			_ = le.Close()
			if m := le.MemFiles(); len(m) > 0 {
				t.Errorf("guest memory files left: %v", m)
			}
		}
	}
	for _, name := range names {
		s := res[name]
		t.Logf("%-5s fork %d: median %d ms %v; per child: CPU to answering %d ms, private %d MiB, PSS %d MiB; after one exec each PSS %d MiB; ten execs median %d ms %v, PSS after %d MiB; then a second identity round trip %d ms, one exec %d ms, private after it %d MiB",
			name, n, median(s.forkMS), s.forkMS, median(s.cpuMS), median(s.priv), median(s.pss), median(s.pss1), median(s.steadyMS), s.steadyMS, median(s.pss2), median(s.recMS), median(s.execMS), median(s.priv2))
	}
}

func median(v []int) int {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// cpuMS is a process's user and system CPU time in milliseconds.
func cpuMS(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return (u + s) * 10 // USER_HZ is 100
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// execLong is enginetest.Exec with room for a loaded host: python's start
// under TCG takes a minute there.
func execLong(t *testing.T, sb engine.Sandbox, argv ...string) enginetest.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	p, err := sb.Guest().Exec(ctx, guest.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	var out bytes.Buffer
	_, _ = io.Copy(&out, p.Stdout)
	_, _ = io.Copy(io.Discard, p.Stderr)
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return enginetest.Result{Stdout: out.String(), Exit: exit}
}

// wrapLever makes a lever from a name w<TB>[a][s]: QEMU through a wrapper
// script, with a translation cache of TB MiB, and a: MALLOC_ARENA_MAX=1,
// s: split-wx=on (the TCG cache in a memfd, no huge pages for it).
func wrapLever(t *testing.T, name string) (lever, error) {
	rest, ok := strings.CutPrefix(name, "w")
	if !ok {
		return lever{}, fmt.Errorf("no lever %q", name)
	}
	i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(rest)
	}
	tb, err := strconv.Atoi(rest[:i])
	if err != nil {
		return lever{}, fmt.Errorf("lever %q: %v", name, err)
	}
	flags := rest[i:]
	qemuBin := "/usr/bin/qemu-system-x86_64"
	script := "#!/bin/bash\nargs=()\nfor a in \"$@\"; do\n"
	if strings.Contains(flags, "s") {
		script += "  case \"$a\" in tcg,tb-size=*) a=\"$a,split-wx=on\";; esac\n"
	}
	script += "  args+=(\"$a\")\ndone\n"
	if strings.Contains(flags, "a") {
		script += "export MALLOC_ARENA_MAX=1\n"
	}
	script += "exec " + qemuBin + " \"${args[@]}\"\n"
	p := filepath.Join(t.TempDir(), name+".sh")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		return lever{}, err
	}
	return lever{cfg: func(c *qemu.Config) { c.QEMU = p; c.TCGCacheMiB = tb }}, nil
}
