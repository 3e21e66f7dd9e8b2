package sandbox

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// The tests in this file run real runsc sandboxes (root; the default
// image): the race they are about is between a sleeper and the agent's
// calls, which the fake engine has none of.

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// newRealManager returns a Manager on runsc, with a local snapshot store
// (the drain's SleepIdle needs one). Its sandboxes are removed at the end
// of the test.
func newRealManager(t *testing.T) *Manager {
	t.Helper()
	runsc := testenv.Runsc(t)
	imagesDir := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	eng, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "engine"), Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := image.NewStore(imagesDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := snapstore.NewLocal(filepath.Join(dir, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	copies, err := snapstore.NewCopies(objects, filepath.Join(dir, "copies"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{SnapshotDir: filepath.Join(dir, "snapshots"), SleepDir: filepath.Join(dir, "sleep"), Copies: copies,
		MemoryFloorMiB: 1, PressureFloorMiB: -1}
	for _, d := range []string{cfg.SnapshotDir, cfg.SleepDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	m := New(cfg, eng, st, imgs)
	t.Cleanup(func() {
		ctx := context.Background()
		recs, _ := st.ListSandboxes(ctx)
		for _, rec := range recs {
			if err := m.Destroy(ctx, rec.ID); err != nil {
				t.Errorf("remove %s: %v", rec.ID, err)
			}
		}
		m.Close()
		copies.Close()
		st.Close()
	})
	return m
}

// idleSleeper is one of the sleepers that put a sandbox to sleep for
// being idle, run once on a sandbox; it reports whether it slept it.
type idleSleeper struct {
	name string
	opts store.Options
	run  func(t *testing.T, m *Manager, id string) bool
}

var idleSleepers = []idleSleeper{
	{"drain", store.Options{}, func(t *testing.T, m *Manager, id string) bool {
		busy, err := NewMover(m).SleepIdle(t.Context(), id)
		if err != nil {
			t.Fatalf("SleepIdle: %v", err)
		}
		t.Logf("SleepIdle: busy %q", busy)
		return busy == ""
	}},
	{"idle-sleep", store.Options{IdleSleepMS: 60_000}, func(t *testing.T, m *Manager, id string) bool {
		before := m.counters.IdleSleeps.Load()
		m.lifetimes.sleepIdle(t.Context(), id)
		return m.counters.IdleSleeps.Load() > before
	}},
	{"pressure", store.Options{}, func(t *testing.T, m *Manager, id string) bool {
		snapper, err := snapshotterOf(m.eng)
		if err != nil {
			t.Fatal(err)
		}
		return m.lifetimes.sleepForPressure(t.Context(), snapper, id, 0)
	}},
}

// setSleepRaceHook makes f the sleepers' hook for the rest of the test.
func setSleepRaceHook(t *testing.T, f func(point, id string)) {
	sleepRaceHook = f
	t.Cleanup(func() { sleepRaceHook = nil })
}

// unused makes sandbox id look unused for an hour, as if its idle time
// (every sleeper's: idleAfter, an idle sleep of a minute) had passed.
func unused(m *Manager, id string) {
	m.traffic.mu.Lock()
	m.traffic.lastUsed[id] = time.Now().Add(-time.Hour)
	m.traffic.mu.Unlock()
}

// TestIdleSleepersLoseToCalls: a call that reaches a sandbox after a
// sleeper found it idle, but before the sleeper took it out of service,
// wins: the sleeper backs off and the sandbox runs on. An exec that
// started then runs to its end (its stdin written after the sleeper's
// turn), and a hold taken then (an ingress request) keeps the sandbox
// running. Each sleeper of idle sandboxes: the drain's SleepIdle, the
// idle sleep, the memory pressure sleeper.
func TestIdleSleepersLoseToCalls(t *testing.T) {
	m := newRealManager(t)
	for _, sl := range idleSleepers {
		t.Run(sl.name, func(t *testing.T) {
			rec, err := m.Create(t.Context(), CreateRequest{Image: "default", MemoryMiB: 256, Opts: sl.opts})
			if err != nil {
				t.Fatal(err)
			}
			id := rec.ID

			// An exec that starts in the sleeper's window.
			var p *guest.Process
			setSleepRaceHook(t, func(point, hid string) {
				if point != "idle" || hid != id || p != nil {
					return
				}
				g, err := m.GuestWaking(t.Context(), id)
				if err != nil {
					t.Errorf("exec in the window: %v", err)
					return
				}
				if p, err = g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"sh", "-c", `read x; echo "got $x"`}, Stdin: true}); err != nil {
					t.Errorf("exec in the window: %v", err)
				}
			})
			unused(m, id)
			slept := sl.run(t, m, id)
			sleepRaceHook = nil
			if p == nil {
				t.Fatal("the sleeper never reached its window (the sandbox did not look idle)")
			}
			if slept {
				t.Errorf("%s put the sandbox to sleep under an exec that had started", sl.name)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			outc := make(chan string, 1)
			go func() {
				b, _ := io.ReadAll(p.Stdout)
				outc <- string(b)
			}()
			_, werr := io.WriteString(p.Stdin, "hi\n")
			p.Stdin.Close()
			exit, err := p.Wait(ctx)
			p.Close()
			out := <-outc
			if werr != nil || err != nil || exit.Code != 0 || out != "got hi\n" {
				t.Errorf("the exec started in the sleeper's window: stdin %v, exit %+v %v, stdout %q; want exit 0, \"got hi\"", werr, exit, err, out)
			}
			if st, _ := m.Get(t.Context(), id); st.State != store.StateRunning {
				t.Errorf("after the exec: the sandbox is %s, want running", st.State)
			}

			// A hold (a proxied request or connection) taken in the window.
			if _, err := m.Wake(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			var release func()
			setSleepRaceHook(t, func(point, hid string) {
				if point == "idle" && hid == id && release == nil {
					release = m.Traffic().Hold(id)
				}
			})
			unused(m, id)
			slept = sl.run(t, m, id)
			sleepRaceHook = nil
			if release == nil {
				t.Fatal("the sleeper never reached its window (the sandbox did not look idle)")
			}
			release()
			if slept {
				t.Errorf("%s put the sandbox to sleep under a hold taken before it", sl.name)
			}
			if st, _ := m.Get(t.Context(), id); st.State != store.StateRunning {
				t.Errorf("after the hold: the sandbox is %s, want running", st.State)
			}
		})
	}
}

// TestIdleSleepersWinOverLaterCalls: once a sleeper has taken an idle
// sandbox out of service, an exec that comes waits for the sleep to end
// and then wakes the sandbox, and runs: it does not fail for a sleep it
// did not ask for.
func TestIdleSleepersWinOverLaterCalls(t *testing.T) {
	m := newRealManager(t)
	for _, sl := range idleSleepers {
		t.Run(sl.name, func(t *testing.T) {
			rec, err := m.Create(t.Context(), CreateRequest{Image: "default", MemoryMiB: 256, Opts: sl.opts})
			if err != nil {
				t.Fatal(err)
			}
			id := rec.ID
			type result struct {
				out  string
				exit guest.ExitStatus
				err  error
			}
			res := make(chan result, 1)
			started := false
			setSleepRaceHook(t, func(point, hid string) {
				if point != "retired" || hid != id || started {
					return
				}
				started = true
				go func() {
					var r result
					defer func() { res <- r }()
					g, err := m.GuestWaking(t.Context(), id)
					if r.err = err; err != nil {
						return
					}
					p, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"sh", "-c", "echo awake"}})
					if r.err = err; err != nil {
						return
					}
					defer p.Close()
					b, _ := io.ReadAll(p.Stdout)
					r.out = string(b)
					r.exit, r.err = p.Wait(t.Context())
				}()
				// The exec waits for the sandbox's lock, which the sleeper
				// holds: the sleep goes on once it does.
				for deadline := time.Now().Add(time.Minute); lockRefs(m, id) < 2; {
					if time.Now().After(deadline) {
						t.Error("the exec never waited for the sleeper's lock")
						return
					}
					time.Sleep(time.Millisecond) // polling the lock's waiters
				}
			})
			wakes := m.counters.Wakes.Load()
			unused(m, id)
			slept := sl.run(t, m, id)
			sleepRaceHook = nil
			if !started {
				t.Fatal("the sleeper never took the sandbox out of service")
			}
			if !slept {
				t.Errorf("%s did not put the idle sandbox to sleep", sl.name)
			}
			r := <-res
			if r.err != nil || r.exit.Code != 0 || r.out != "awake\n" {
				t.Errorf("an exec that came once the sleeper had decided: exit %+v %v, stdout %q; want exit 0, \"awake\"", r.exit, r.err, r.out)
			}
			if n := m.counters.Wakes.Load() - wakes; n != 1 {
				t.Errorf("%d wakes, want 1 (the exec's)", n)
			}
			if st, _ := m.Get(t.Context(), id); st.State != store.StateRunning {
				t.Errorf("after the exec: the sandbox is %s, want running", st.State)
			}
		})
	}
}

// lockRefs is how many hold or wait for sandbox id's lock.
func lockRefs(m *Manager, id string) int {
	k := &m.locks.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.locks[id]; l != nil {
		return l.refs
	}
	return 0
}
