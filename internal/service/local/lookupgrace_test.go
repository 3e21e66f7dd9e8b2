package local_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/local"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// checkpointHooked is the runsc engine with a hook called as each
// checkpoint begins (a sleep's: the sandbox is out of service, its agent
// still connected), before the engine quiesces the agent.
type checkpointHooked struct {
	*gvisor.Engine
	mu   sync.Mutex
	hook func(engineID string) // guarded by mu
}

func (e *checkpointHooked) setHook(f func(engineID string)) {
	e.mu.Lock()
	e.hook = f
	e.mu.Unlock()
}

func (e *checkpointHooked) Checkpoint(ctx context.Context, id, image string, leaveRunning bool) error {
	e.mu.Lock()
	f := e.hook
	e.mu.Unlock()
	if f != nil {
		f(id)
	}
	return e.Engine.Checkpoint(ctx, id, image, leaveRunning)
}

// newRealLocal returns the local service over a Manager on runsc (root;
// the default image), its lifetimes watched (idle sleeps) until the test
// ends. Its sandboxes are removed at the end of the test.
func newRealLocal(t *testing.T) (*sandbox.Manager, *local.Service, *checkpointHooked) {
	t.Helper()
	runsc := testenv.Runsc(t)
	imagesDir := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	dir := testenv.TempDir(t)
	g, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "engine"), Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	eng := &checkpointHooked{Engine: g}
	st, err := store.Open(t.Context(), filepath.Join(dir, "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := image.NewStore(imagesDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots"), SleepDir: filepath.Join(dir, "sleep"),
		MemoryFloorMiB: 1, PressureFloorMiB: -1}
	for _, d := range []string{cfg.SnapshotDir, cfg.SleepDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mgr := sandbox.New(cfg, eng, st, imgs)
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		mgr.Lifetimes().WatchLifetimes(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-watched
		ctx := context.Background()
		recs, _ := st.ListSandboxes(ctx)
		for _, rec := range recs {
			if err := mgr.Destroy(ctx, rec.ID); err != nil {
				t.Errorf("remove %s: %v", rec.ID, err)
			}
		}
		mgr.Close()
		st.Close()
	})
	return mgr, local.New(local.Config{Version: "test"}, mgr), eng
}

// TestExecOutlastsLookupGrace: an exec held between its lookup of a
// sandbox and its agent call for longer than the lookup grace (a loaded
// host, a slow upload before it, a proxied exec), on a sandbox with a
// short idle sleep, while the idle sleep takes the sandbox: the exec
// neither fails nor has its process frozen into the sleep image. It runs,
// once, on the sandbox woken after the sleep; without wake it is refused
// as on any sleeping sandbox (Conflict), and never runs. The exec is let
// go as the sleeper's checkpoint begins (the sandbox out of service, its
// agent still connected: the checkpoint then waits for the exec's call to
// start or be refused) or once the sandbox sleeps.
func TestExecOutlastsLookupGrace(t *testing.T) {
	mgr, svc, eng := newRealLocal(t)
	const marker = "slow-exec-marker"
	for _, tc := range []struct {
		name    string
		release string // "checkpoint" or "asleep"
		wake    bool
	}{
		{"at-checkpoint", "checkpoint", true},
		{"asleep", "asleep", true},
		{"at-checkpoint-no-wake", "checkpoint", false},
		{"asleep-no-wake", "asleep", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := mgr.Create(t.Context(), sandbox.CreateRequest{Image: "default", MemoryMiB: 256,
				Opts: store.Options{IdleSleepMS: 100}})
			if err != nil {
				t.Fatal(err)
			}
			id := rec.ID
			t.Cleanup(func() {
				if err := mgr.Destroy(context.Background(), id); err != nil {
					t.Errorf("remove %s: %v", id, err)
				}
			})

			// The sandbox's events: its exec's start, its sleeps.
			_, sub, err := mgr.Events().Subscribe(0, false, events.Filter{Sandbox: id})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			var (
				mu      sync.Mutex
				armed   uint64 // the last event's seq when the exec had looked up its sandbox
				started = make(chan struct{})
				slept   = make(chan struct{})
			)
			go func() {
				startedOnce, sleptOnce := false, false
				for {
					select {
					case <-sub.Done():
						return
					case e := <-sub.C():
						mu.Lock()
						after := armed != 0 && e.Seq > armed
						mu.Unlock()
						switch {
						case e.Type == events.ExecStarted && !startedOnce && len(e.Exec.Cmd) == 3 && e.Exec.Cmd[2] == script(marker):
							startedOnce = true
							close(started)
						case e.Type == events.Slept && after && !sleptOnce:
							sleptOnce = true
							close(slept)
						}
					}
				}
			}()
			wait := func(what string, c <-chan struct{}) bool {
				select {
				case <-c:
					return true
				case <-time.After(3 * time.Minute):
					t.Errorf("timed out waiting for %s", what)
					return false
				}
			}

			checkpointing := make(chan struct{})
			refused := make(chan struct{})
			var lookedUp, refusedOnce bool
			defer local.SetCallHook(func(point, ref string) {
				if ref != id {
					return
				}
				switch {
				case point == "refused" && !refusedOnce:
					refusedOnce = true
					close(refused)
				case point == "looked-up" && !lookedUp:
					lookedUp = true
					// The lookup is done: any checkpoint, sleep from now
					// on is the idle sleep's that follows it.
					cur, err := mgr.Get(t.Context(), id)
					if err != nil {
						t.Errorf("get: %v", err)
						return
					}
					engineID := cur.Engine()
					mu.Lock()
					armed = mgr.Events().Latest()
					mu.Unlock()
					eng.setHook(func(eid string) {
						if eid != engineID {
							return
						}
						eng.setHook(nil)
						close(checkpointing)
						if tc.release == "checkpoint" {
							// The checkpoint goes on once the exec's call
							// has started (a process in the sandbox) or
							// been refused.
							select {
							case <-started:
							case <-refused:
							case <-time.After(3 * time.Minute):
								t.Error("the exec's call neither started nor was refused")
							}
						}
					})
					if tc.release == "checkpoint" {
						wait("the idle sleep's checkpoint", checkpointing)
					} else {
						wait("the idle sleep", slept)
					}
				}
			})()

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			p, err := svc.Exec(ctx, id, service.WakeMode(tc.wake), api.ExecRequest{Cmd: []string{"sh", "-c", script(marker)}, Stdin: true})
			local.SetCallHook(nil)
			if !lookedUp {
				t.Fatalf("the exec never looked up its sandbox: %v", err)
			}
			// Whatever the exec did, the idle sleep it was held across
			// has happened before the exec writes or waits.
			if !wait("the idle sleep", slept) {
				return
			}
			if !refusedOnce {
				t.Errorf("the exec's first call was not refused by the connection of the sandbox the sleep took (exec: %v)", err)
			}
			if !tc.wake {
				if err == nil {
					p.Close()
					t.Errorf("an exec that does not wake ran on a sandbox an idle sleep took under it")
				} else if !errdefs.IsConflict(err) {
					t.Errorf("an exec that does not wake, on a sandbox an idle sleep took under it: %v, want a Conflict (sleeping)", err)
				}
			} else if err != nil {
				t.Errorf("exec held across an idle sleep: %v", err)
			} else {
				outc := make(chan string, 1)
				go func() {
					b, _ := io.ReadAll(p.Stdout())
					outc <- string(b)
				}()
				_, werr := io.WriteString(p.Stdin(), "hi\n")
				p.Stdin().Close()
				exit, err := p.Wait(ctx)
				p.Close()
				out := <-outc
				if werr != nil || err != nil || exit.Code != 0 || out != "got hi\n" {
					t.Errorf("exec held across an idle sleep: stdin %v, exit %+v %v, stdout %q; want exit 0, \"got hi\"", werr, exit, err, out)
				}
			}

			// Ran once if it woke the sandbox, never if not; and no
			// process of it left in the sandbox (frozen into the image
			// and woken with it).
			want := "0 0\n"
			if tc.wake {
				want = "1 0\n"
			}
			check := `n=$(cat /tmp/runs 2>/dev/null | wc -l); left=$(for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '` +
				marker[:len(marker)-1] + `[` + marker[len(marker)-1:] + `]'); echo "$n $left"`
			if got := run(t, svc, id, check); got != want {
				t.Errorf("runs of the exec, its processes left: %q, want %q", got, want)
			}
		})
	}
}

// script is the exec's command: it counts its runs in /tmp/runs and waits
// for a line on stdin, so that it is in flight at the checkpoint.
func script(marker string) string {
	return `echo run >> /tmp/runs; read x; echo "got $x" # ` + marker
}

// run runs cmd in sandbox id (waking it) and returns its stdout.
func run(t *testing.T, svc *local.Service, id, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	p, err := svc.Exec(ctx, id, service.Wake, api.ExecRequest{Cmd: []string{"sh", "-c", cmd}})
	if err != nil {
		t.Errorf("exec %q: %v", cmd, err)
		return ""
	}
	defer p.Close()
	b, _ := io.ReadAll(p.Stdout())
	if exit, err := p.Wait(ctx); err != nil || exit.Code != 0 {
		t.Errorf("exec %q: exit %+v %v", cmd, exit, err)
	}
	return string(b)
}
