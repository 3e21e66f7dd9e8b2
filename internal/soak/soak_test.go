// Package soak_test is clade's chaos soak: several clients drive random
// lifecycle operations through the SDK against a real daemon (real runsc)
// while the daemon is SIGKILLed (at random moments and at named crash
// points) and its data dir's file system is filled; after every restart and
// at the end it checks that nothing acknowledged was lost and, once
// everything is removed, that nothing leaked. See docs/reliability.md.
//
// CLADE_SOAK_OPS sets the number of operations (default 60, the short run
// of `make test-slow`, which CI runs; `make soak` runs more), CLADE_SOAK_SEED the seed (printed
// at the start) and CLADE_SOAK_CLIENTS the number of clients (3).
package soak_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// crashPoints are the daemon's CLADE_CRASH_AT points (internal/sandbox).
var crashPoints = []string{
	"create-before-engine", "create-after-engine", "destroy-before-engine", "destroy-after-engine",
	"snapshot-before-engine", "sleep-before-engine", "sleep-before-seal", "sleep-after-checkpoint", "sleep-before-reap", "wake-before-engine", "wake-after-engine-id",
	"fork-after-children", "fork-mid-restore",
}

const (
	opTimeout = 3 * time.Minute
	sbMemMiB  = 256
	sbDiskMiB = 64
	// counterStart starts the counter process the checks watch: it must
	// keep advancing across restarts, sleeps, wakes and forks.
	counterStart = `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.1; done' > /dev/null 2>&1 &
until [ -s /tmp/counter ]; do sleep 0.01; done`
)

func envInt(t *testing.T, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want an integer", name, v)
	}
	return n
}

// soak is one run.
type soak struct {
	t       *testing.T
	d       *testenv.Daemon
	seed    int64
	total   int64
	clients int
	mnt     string
	model   *model
	stats   *stats

	// gate: clients hold it shared for one operation; the controller
	// takes it exclusively to restart and check.
	gate sync.RWMutex
	// gen counts daemon processes (it moves on after each start); a broken
	// connection in generation g makes the controller check whether
	// daemon g is dead.
	gen     atomic.Int64
	client  atomic.Pointer[sdk.Client]
	claimed atomic.Int64
	done    atomic.Int64
	// diskFull is set while the filler holds the file system.
	diskFull atomic.Bool
	// armed is the crash point the running daemon was started with.
	armed string

	progress chan struct{}
	suspect  chan int64
	// genMu and genCond let a client that saw a broken connection wait
	// until the controller has looked at the daemon (restarted it, or
	// found it alive: cleared).
	genMu   sync.Mutex
	genCond *sync.Cond
	cleared int64
	// restartedFree: the daemon was restarted with the disk not full
	// since the last check.
	restartedFree bool
	// pools: the daemon runs with a hot and a warm pool.
	pools bool
	// failAfter, if not zero, fails the run on purpose after that many
	// operations (CLADE_SOAK_FAIL_AFTER): TestSoakCleansUpAfterAFailure.
	failAfter int64
}

func TestSoak(t *testing.T) {
	testenv.Slow(t)
	testenv.RequireRoot(t)
	seed := envInt(t, "CLADE_SOAK_SEED", time.Now().UnixNano()%1_000_000_007)
	total := envInt(t, "CLADE_SOAK_OPS", 60)
	clients := int(envInt(t, "CLADE_SOAK_CLIENTS", 3))
	t.Logf("soak: seed %d (CLADE_SOAK_SEED=%d to repeat), %d operations, %d clients", seed, seed, total, clients)
	fmt.Fprintf(os.Stderr, "soak: seed %d, %d operations, %d clients\n", seed, total, clients)
	start := time.Now()

	// The data dir lives on a small file system of its own, so the soak
	// can fill it. Its cleanup runs after the daemon's.
	mnt := loopFS(t, testenv.TempDir(t), 3072)
	dataDir := filepath.Join(mnt, "data")
	s := &soak{t: t, seed: seed, total: total, clients: clients, mnt: mnt, model: newModel(), stats: newStats(),
		progress: make(chan struct{}, 1), suspect: make(chan int64, 16)}
	s.genCond = sync.NewCond(&s.genMu)
	s.cleared = -1
	s.failAfter = envInt(t, "CLADE_SOAK_FAIL_AFTER", 0)
	// The daemon's network share is taken first: held until the reap
	// below has removed its leftovers (cleanups run last registered
	// first), so that no other test takes it in between and loses its
	// resources to the reap.
	netPlan := testenv.ReserveNet(t)
	// The last of the soak's cleanups, after the daemon's own (which
	// removes through the API what it still can) and before the file
	// system is unmounted: however the test ended (a t.Fatal, a daemon
	// that cannot start again, a hung one), nothing it started outlives
	// it: the daemon and every runsc process of its data dir are killed,
	// and their cgroups go.
	t.Cleanup(func() { s.reap(dataDir) })
	// The later --data-dir wins over StartDaemon's own. The pools are on
	// (CLADE_SOAK_POOLS=0 turns them off), so that claims of hot
	// sandboxes and starts of prepared ones meet the kills and the full
	// disk too.
	pools := envInt(t, "CLADE_SOAK_POOLS", 1) != 0
	args := []string{"--data-dir", dataDir, "--disk-floor", "128", "--default-memory", strconv.Itoa(sbMemMiB)}
	if pools {
		args = append(args, "--hot-pool", "2", "--warm-pool", "2")
	}
	t.Logf("soak: pools on: %v (CLADE_SOAK_POOLS)", pools)
	s.d = testenv.StartDaemonOn(t, netPlan, args...)
	t.Logf("soak: network prefix %s", s.d.Net.Prefix)
	s.pools = pools
	s.d.DataDir = dataDir
	s.newClient()
	// Before the daemon's cleanup (removal of everything, leak census):
	// free the disk, and remove what the soak built.
	t.Cleanup(func() {
		// Clients still running (the test failed under them) start
		// nothing more.
		s.claimed.Store(math.MaxInt64 / 2)
		if t.Failed() {
			// Keep what the daemon said for the findings: its log goes
			// with the temp dir.
			if f, err := os.CreateTemp("", "clade-soak-daemon-*.log"); err == nil {
				_, _ = f.WriteString(s.d.Log())
				f.Close()
				t.Logf("the daemon's log is kept in %s", f.Name())
			}
		}
		os.Remove(filepath.Join(mnt, "filler"))
		if s.d.Exited() {
			s.d.Start(nil) // so that its cleanup removes the sandboxes
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := s.client.Load()
		if sbs, err := c.ListSandboxes(ctx); err == nil {
			for _, sb := range sbs {
				_ = c.DeleteSandbox(ctx, sb.ID)
			}
		}
		for _, img := range append(s.model.images, s.model.maybeImages...) {
			_ = c.DeleteImage(ctx, img)
		}
	})

	s.run()
	s.finish()
	t.Logf("soak summary (seed %d, %s):\n%s", seed, time.Since(start).Round(time.Second), s.stats.summary())
	fmt.Fprintf(os.Stderr, "soak summary (seed %d, %s):\n%s", seed, time.Since(start).Round(time.Second), s.stats.summary())
	if s.stats.lost != 0 {
		t.Errorf("lost %d acknowledged things (see above)", s.stats.lost)
	}
}

// newClient makes a fresh SDK client for a new daemon process, so that no
// connection of a dead one is reused.
func (s *soak) newClient() {
	c, err := sdk.New(s.d.Socket)
	if err != nil {
		s.t.Fatal(err)
	}
	s.client.Store(c)
}

// finding records something wrong with clade; lost says it lost something
// acknowledged.
func (s *soak) finding(lost bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.stats.mu.Lock()
	if lost {
		s.stats.lost++
	}
	s.stats.findings = append(s.stats.findings, msg)
	s.stats.mu.Unlock()
	s.t.Errorf("%s", msg)
}

// plan is when the faults happen, by completed operation count.
type plan struct {
	kills      []int64
	fillStart  int64
	fillEnd    int64
	buildAt    int64
	armChance  float64
	killDelays []time.Duration
}

func (s *soak) plan(rng *rand.Rand) plan {
	n := s.total
	kills := max(2, n/40)
	fills := int64(1)
	p := plan{armChance: 0.5, buildAt: 1 + rng.Int63n(max(1, n/2))}
	for range kills {
		p.kills = append(p.kills, n/10+rng.Int63n(max(1, n*8/10)))
		p.killDelays = append(p.killDelays, time.Duration(rng.Int63n(int64(400*time.Millisecond))))
	}
	sort.Slice(p.kills, func(i, j int) bool { return p.kills[i] < p.kills[j] })
	_ = fills
	p.fillStart = n/5 + rng.Int63n(max(1, n/2))
	p.fillEnd = p.fillStart + max(8, n/10)
	return p
}

// run starts the clients and injects the faults until the clients are
// done.
func (s *soak) run() {
	rng := rand.New(rand.NewSource(s.seed))
	p := s.plan(rng)
	s.t.Logf("plan: kills after ops %v, disk full over ops %d-%d, a build at op %d", p.kills, p.fillStart, p.fillEnd, p.buildAt)
	var wg sync.WaitGroup
	for i := range s.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.clientLoop(i, rand.New(rand.NewSource(s.seed*1000+int64(i)+1)), p.buildAt)
		}()
	}
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()

	nextKill, filling, filled := 0, false, false
	for {
		select {
		case <-clientsDone:
			if filling {
				s.unfill()
			}
			return
		case g := <-s.suspect:
			s.onSuspect(g)
		case <-s.progress:
		}
		// A daemon that died at a crash point is restarted before any
		// planned fault.
		for drained := false; !drained; {
			select {
			case g := <-s.suspect:
				s.onSuspect(g)
			default:
				drained = true
			}
		}
		n := s.done.Load()
		if s.failAfter > 0 && n >= s.failAfter {
			s.failOnPurpose()
		}
		if nextKill < len(p.kills) && n >= p.kills[nextKill] {
			// A random moment while the other clients are mid-operation.
			<-time.After(p.killDelays[nextKill])
			for drained := false; !drained; {
				select {
				case g := <-s.suspect:
					s.onSuspect(g)
				default:
					drained = true
				}
			}
			s.kill(rng.Float64() < p.armChance, rng)
			nextKill++
		}
		if !filled && n >= p.fillStart {
			s.fillDisk()
			filling, filled = true, true
			// The disk stays full for a number of operations from now.
			p.fillEnd = s.done.Load() + p.fillEnd - p.fillStart
		}
		if filling && n >= p.fillEnd {
			s.unfill()
			filling = false
		}
	}
}

// kill SIGKILLs the daemon now, restarts it (armed with a random crash
// point when arm is set) and checks the model.
func (s *soak) kill(arm bool, rng *rand.Rand) {
	s.d.Kill()
	s.stats.mu.Lock()
	s.stats.kills++
	s.stats.mu.Unlock()
	s.gate.Lock()
	defer s.gate.Unlock()
	s.restart("")
	s.check("after SIGKILL")
	if arm {
		// The check must not run into the crash point: arm it only now,
		// with one more restart while nothing runs.
		s.d.Kill()
		s.restart(crashPoints[rng.Intn(len(crashPoints))])
	}
}

// failOnPurpose ends the run as a daemon that cannot start again would:
// it is killed with sandboxes running and clients mid-operation, and its
// restart (and the cleanup's) fails the test with t.Fatal.
func (s *soak) failOnPurpose() {
	s.t.Logf("failing on purpose after %d operations (CLADE_SOAK_FAIL_AFTER): the daemon is killed and cannot start again", s.done.Load())
	s.d.Kill()
	s.d.SetArgs("--no-such-flag")
	s.d.Start(nil)
}

// reap kills what the run left (see TestSoak's cleanup) and says so.
func (s *soak) reap(dataDir string) {
	if s.d != nil && !s.d.Exited() {
		s.d.Kill()
	}
	if left := testenv.ReapProcesses(s.mnt); len(left) > 0 {
		s.t.Logf("killed %d processes the run left:\n  %s", len(left), strings.Join(left, "\n  "))
		if !s.t.Failed() {
			s.t.Errorf("the run left %d processes", len(left))
		}
	}
	if s.d != nil {
		// The killed daemon's network slots, namespaces and table; once
		// the share is released another test may hold it, and its
		// resources are not the run's to remove.
		if !s.d.Net.Held() {
			s.t.Errorf("the network share %s was released before the reap: its leftovers are not removed", s.d.Net.Prefix)
		} else if leaks := s.d.Net.NetLeaks(); len(leaks) > 0 {
			s.t.Logf("removing the network resources the run left: %v", leaks)
			if err := s.d.Net.RemoveNetLeaks(); err != nil {
				s.t.Errorf("removing the network resources the run left: %v", err)
			}
		}
	}
	// runsc's cgroups (one per controller) outlive its killed sandboxes.
	ents, _ := os.ReadDir(filepath.Join(dataDir, "gvisor", "sandboxes"))
	for _, e := range ents {
		cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "clade", e.Name()))
		for _, cg := range cgs {
			_ = os.Remove(cg)
		}
	}
}

// onSuspect handles a broken connection seen in daemon generation g: if
// that daemon died (a crash point fired), restart it and check.
func (s *soak) onSuspect(g int64) {
	s.gate.Lock()
	defer s.gate.Unlock()
	if g != s.gen.Load() {
		return // that daemon was already replaced
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := s.client.Load().Health(ctx)
	cancel()
	if err == nil {
		s.finding(false, "a connection broke while daemon generation %d was alive and well (armed crash point %q)", g, s.armed)
		s.genMu.Lock()
		s.cleared = g
		s.genCond.Broadcast()
		s.genMu.Unlock()
		return
	}
	_ = s.d.Wait()
	point := s.armed
	s.stats.mu.Lock()
	s.stats.crashes++
	s.stats.mu.Unlock()
	s.t.Logf("the daemon died at crash point %q", point)
	s.restart("")
	s.check("after crash point " + point)
}

// restart starts a new daemon on the same data dir. Call with the gate
// held.
func (s *soak) restart(point string) {
	var env []string
	if point != "" {
		env = []string{"CLADE_CRASH_AT=" + point}
		s.stats.mu.Lock()
		s.stats.armed = append(s.stats.armed, point)
		s.stats.mu.Unlock()
	}
	s.armed = point
	t0 := time.Now()
	s.d.Start(env)
	s.restartedFree = s.restartedFree || !s.diskFull.Load()
	s.t.Logf("daemon restarted in %s (crash point armed: %q, disk full: %v)", time.Since(t0).Round(time.Millisecond), point, s.diskFull.Load())
	s.newClient()
	s.genMu.Lock()
	s.gen.Add(1) // connections that broke before now are the old daemon's
	s.genCond.Broadcast()
	s.genMu.Unlock()
	s.stats.mu.Lock()
	s.stats.restarts++
	s.stats.mu.Unlock()
}

func (s *soak) fillDisk() {
	s.diskFull.Store(true)
	t0 := time.Now()
	n, err := fill(filepath.Join(s.mnt, "filler"))
	if err != nil {
		s.t.Errorf("filling the disk: %v", err)
	}
	s.stats.mu.Lock()
	s.stats.fills++
	s.stats.filled += n
	s.stats.mu.Unlock()
	s.t.Logf("disk full: the filler took %d MiB in %s", n>>20, time.Since(t0).Round(time.Millisecond))
}

// unfill frees the disk and checks that nothing was lost while it was
// full.
func (s *soak) unfill() {
	s.gate.Lock()
	defer s.gate.Unlock()
	if err := os.Remove(filepath.Join(s.mnt, "filler")); err != nil {
		s.t.Errorf("removing the filler: %v", err)
	}
	s.diskFull.Store(false)
	if s.armed == "" {
		// (With a crash point armed, the check waits for the crash, or
		// the end: the check's own wakes must not run into it.)
		s.check("after the disk was full")
	}
}

// finish checks once more (after a restart if a crash point is still
// armed), removes everything and takes the leak census.
func (s *soak) finish() {
	s.gate.Lock()
	defer s.gate.Unlock()
	if s.armed != "" || len(s.model.deferred) > 0 {
		s.d.Kill()
		s.stats.mu.Lock()
		s.stats.kills++
		s.stats.mu.Unlock()
		s.restart("")
	}
	s.check("at the end")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := s.client.Load()
	ids := make([]string, 0, len(s.model.sbs))
	for id := range s.model.sbs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			s.t.Errorf("removing sandbox %s at the end: %v", id, err)
		}
		delete(s.model.sbs, id)
	}
	for id, sn := range s.model.snaps {
		if sn.implicit {
			continue // removed with its last child
		}
		if err := c.DeleteSnapshot(ctx, id); err != nil {
			s.t.Errorf("removing snapshot %s at the end: %v", id, err)
		}
	}
	for _, img := range s.model.images {
		if err := c.DeleteImage(ctx, img); err != nil {
			s.t.Errorf("removing image %s at the end: %v", img, err)
		}
	}
	for _, img := range s.model.maybeImages {
		if err := c.DeleteImage(ctx, img); err != nil && !sdk.IsNotFound(err) {
			s.t.Errorf("removing image %s at the end: %v", img, err)
		}
	}
	s.model.images, s.model.maybeImages = nil, nil
	if sbs, err := c.ListSandboxes(ctx); err != nil || len(sbs) != 0 {
		s.t.Errorf("after removing everything: sandboxes %+v, %v", sbs, err)
	}
	if snaps, err := c.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		s.t.Errorf("after removing everything: snapshots %+v, %v (an implicit snapshot outlived its children?)", snaps, err)
	}
	if s.pools {
		// The pools' sandboxes are the daemon's own until it stops; a
		// clean stop gives them back, and the census sees that too.
		s.d.Stop()
	}
	if leaks := testenv.Leaks(s.d.DataDir); len(leaks) > 0 {
		s.t.Errorf("leak census after removing everything:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// clientLoop runs operations until the soak's total is claimed.
func (s *soak) clientLoop(ci int, rng *rand.Rand, buildAt int64) {
	for n := 0; ; n++ {
		i := s.claimed.Add(1)
		if i > s.total {
			return
		}
		s.gate.RLock()
		g := s.gen.Load()
		c := s.client.Load()
		t0 := time.Now()
		kind, o, err := s.operate(c, ci, n, rng, i == buildAt)
		full := s.diskFull.Load()
		s.gate.RUnlock()
		s.stats.record(kind, o, errCode(err), full, time.Since(t0))
		switch {
		case o == hung:
			s.finding(false, "client %d: %s hung for %s: %v", ci, kind, opTimeout, err)
		case o == unknown || errCode(err) == "connect":
			select {
			case s.suspect <- g:
			default:
			}
			// Wait for the controller's verdict on the daemon rather
			// than burn operations on a dead one.
			s.genMu.Lock()
			for s.gen.Load() == g && s.cleared != g {
				s.genCond.Wait()
			}
			s.genMu.Unlock()
		case o == failed && (errCode(err) == "internal" || strings.Contains(err.Error(), "internal: ")):
			// A failure must say what it is (and what to do).
			s.stats.mu.Lock()
			s.stats.unclear++
			s.stats.mu.Unlock()
			s.t.Logf("client %d: %s failed with an unclassified error (disk full: %v): %v", ci, kind, full, err)
		}
		if o == failed && testing.Verbose() {
			s.t.Logf("client %d: %s failed (disk full: %v): %v", ci, kind, full, err)
		}
		s.done.Add(1)
		select {
		case s.progress <- struct{}{}:
		default:
		}
	}
}

// operate picks and runs one operation. It returns the operation's kind,
// its outcome, and its error.
func (s *soak) operate(c *sdk.Client, ci, n int, rng *rand.Rand, build bool) (string, outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tag := fmt.Sprintf("%d-%d-%d", s.seed%100000, ci, n)
	kind, sb, sn := "build", (*sbox)(nil), (*snap)(nil)
	if !build {
		kind, sb, sn = s.choose(rng)
	}
	var o outcome
	var err error
	switch kind {
	case "build":
		o, err = s.opBuild(ctx, c, tag)
	case "create":
		o, err = s.opCreate(ctx, c, tag, rng)
	case "exec":
		kind, o, err = s.opExecWrite(ctx, c, sb, tag, rng)
	case "cp-in":
		o, err = s.opCopyIn(ctx, c, sb, tag, rng)
	case "cp-out":
		o, err = s.opCopyOut(ctx, c, sb, rng)
	case "rm":
		o, err = s.opRemove(ctx, c, sb)
	case "snapshot":
		o, err = s.opSnapshot(ctx, c, sb, tag)
	case "sleep":
		o, err = s.opSleep(ctx, c, sb)
	case "wake":
		o, err = s.opWake(ctx, c, sb)
	case "fork":
		o, err = s.opForkSandbox(ctx, c, sb, rng)
	case "fork-snapshot":
		o, err = s.opForkSnapshot(ctx, c, sn, rng)
	case "rm-snapshot":
		o, err = s.opRemoveSnapshot(ctx, c, sn)
	}
	// Whatever it was, the client is done with it.
	s.model.mu.Lock()
	if sb != nil {
		sb.busy = false
	}
	if sn != nil {
		sn.busy = false
	}
	s.model.mu.Unlock()
	if o == hung || (o != ok && ctx.Err() != nil) {
		o = hung
	}
	return kind, o, err
}

// choose picks an operation and what it works on, weighted by what exists;
// the sandbox or snapshot it picks is marked busy (the caller's until the
// operation ends).
func (s *soak) choose(rng *rand.Rand) (string, *sbox, *snap) {
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	const limit = 6
	live := m.live()
	free := m.freeSandboxes("")
	running := m.freeSandboxes("running")
	sleeping := m.freeSandboxes("sleeping")
	snaps := m.freeSnaps(false)
	explicit := m.freeSnaps(true)
	type choice struct {
		w    float64
		kind string
		sbs  []*sbox
		sns  []*snap
	}
	var choices []choice
	add := func(w float64, kind string, sbs []*sbox, sns []*snap) {
		choices = append(choices, choice{w, kind, sbs, sns})
	}
	if live < limit {
		w := 2.0
		if live < 2 {
			w = 10
		}
		add(w, "create", nil, nil)
	}
	if len(free) > 0 {
		add(4, "exec", free, nil)
		add(3, "cp-in", free, nil)
		add(2, "cp-out", free, nil)
		if live > 2 {
			w := 1.0
			if live >= limit {
				w = 4
			}
			add(w, "rm", free, nil)
		}
	}
	if len(running) > 0 {
		add(1.5, "snapshot", running, nil)
		add(2, "sleep", running, nil)
		if live < limit-1 {
			add(1, "fork", running, nil)
		}
	}
	if len(sleeping) > 0 {
		add(1.5, "wake", sleeping, nil)
	}
	if len(snaps) > 0 && live < limit-1 {
		add(1, "fork-snapshot", nil, snaps)
	}
	if len(explicit) > 0 {
		add(0.5, "rm-snapshot", nil, explicit)
	}
	add(0.15, "build", nil, nil)
	var sum float64
	for _, ch := range choices {
		sum += ch.w
	}
	x := rng.Float64() * sum
	ch := choices[len(choices)-1]
	for _, c := range choices {
		if x < c.w {
			ch = c
			break
		}
		x -= c.w
	}
	var sb *sbox
	var sn *snap
	if len(ch.sbs) > 0 {
		sb = ch.sbs[rng.Intn(len(ch.sbs))]
		sb.busy = true
	}
	if len(ch.sns) > 0 {
		sn = ch.sns[rng.Intn(len(ch.sns))]
		sn.busy = true
	}
	return ch.kind, sb, sn
}

// TestSoakCleansUpAfterAFailure runs a short soak (in a child test process)
// that fails on purpose as a daemon that cannot start again would, with
// sandboxes running and clients mid-operation: when the child is done,
// nothing it started runs on (no runsc process, no daemon) and nothing of
// it stays mounted. Such a failure used to leave its sandboxes' runsc
// processes running for good.
func TestSoakCleansUpAfterAFailure(t *testing.T) {
	testenv.RequireRoot(t)
	if os.Getenv("CLADE_SOAK_FAIL_AFTER") != "" {
		t.Skip("in the child")
	}
	tmp, err := os.MkdirTemp("", "cladesoakfail")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestSoak$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "CLADE_TEST_SLOW=1", "CLADE_SOAK_OPS=40", "CLADE_SOAK_FAIL_AFTER=6", "CLADE_SOAK_SEED=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "failing on purpose") || !strings.Contains(string(out), "daemon exited at start") {
		t.Fatalf("the child soak: %v, want it failed on purpose:\n%s", err, out)
	}
	if strings.Contains(string(out), "was released before the reap") {
		t.Errorf("the child soak gave its network share up before its reap removed the share's leftovers:\n%s", out)
	}
	// Reaped here too, so that a failure of this test leaks nothing.
	if left := testenv.ReapProcesses(tmp); len(left) > 0 {
		t.Errorf("processes of the failed soak still running after it (killed now):\n  %s\nits output:\n%s", strings.Join(left, "\n  "), out)
	}
	m := regexp.MustCompile(`soak: network prefix (ct[0-9]+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("the child soak did not say its network prefix:\n%s", out)
	}
	if leaks := network.Resources(m[1]); len(leaks) > 0 {
		t.Errorf("network resources of the failed soak after it (removing them now): %v", leaks)
		_ = network.RemoveResources(m[1])
	}
	if mounts := testenv.MountsUnder(tmp); len(mounts) > 0 {
		t.Errorf("mounts of the failed soak after it: %v", mounts)
		for i := len(mounts) - 1; i >= 0; i-- {
			_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH)
		}
	}
}
