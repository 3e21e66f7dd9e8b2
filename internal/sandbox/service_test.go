package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/fake"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/clade-sandbox/clade/internal/store"
)

// These are unit tests of the service's logic on the fake engine: no root,
// no runsc. Whether sandboxes really work is for the conformance suite and
// the daemon tests, on runsc.

const testImage = "test"

type env struct {
	m    *Manager
	eng  *fake.Engine
	st   *store.Store
	imgs *image.Store
	cfg  Config
	hook *recordingHook
}

func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	return newEnvDB(t, cfg, "")
}

// newEnvDB is newEnv with the database at db (if not empty; beside the
// rest otherwise).
func newEnvDB(t testing.TB, cfg Config, db string) *env {
	t.Helper()
	dir := t.TempDir()
	if db == "" {
		db = filepath.Join(dir, "clade.db")
	}
	st, err := store.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	imgs, err := image.NewStore(filepath.Join(dir, "images"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Close()
	img, err := imgs.InstallTar(t.Context(), image.Image{Name: testImage}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SnapshotDir = filepath.Join(dir, "snapshots")
	cfg.SleepDir = filepath.Join(dir, "sleep")
	if cfg.MemoryFloorMiB == 0 {
		cfg.MemoryFloorMiB = 1 // the host's memory is not what these tests are about
	}
	if cfg.PressureFloorMiB == 0 {
		cfg.PressureFloorMiB = -1
	}
	e := &env{eng: fake.New(), st: st, imgs: imgs, hook: &recordingHook{}}
	cfg.Hooks = append(cfg.Hooks, e.hook)
	e.cfg = cfg
	e.m = New(cfg, e.eng, st, imgs)
	if _, err := e.m.images.install(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	return e
}

// restart makes a new service on the same store and engine, as a restarted
// daemon would have, and reconciles.
func (e *env) restart(t *testing.T, cfg Config) {
	t.Helper()
	cfg.SnapshotDir, cfg.SleepDir, cfg.Hooks = e.cfg.SnapshotDir, e.cfg.SleepDir, e.cfg.Hooks
	cfg.MemoryFloorMiB, cfg.PressureFloorMiB = 1, -1
	e.m = New(cfg, e.eng, e.st, e.imgs)
	if err := e.m.Reconcile(t.Context()); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

func (e *env) create(t *testing.T, mib int) store.Sandbox {
	t.Helper()
	sb, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: mib})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func (e *env) state(t *testing.T, id string) string {
	t.Helper()
	rec, err := e.st.GetSandbox(t.Context(), id)
	if errdefs.IsNotFound(err) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// unrecorded returns the engine sandboxes that no record names and the pool
// does not hold: leaks.
func (e *env) unrecorded(t *testing.T) []string {
	t.Helper()
	ids, _ := e.eng.List(t.Context())
	recs, _ := e.st.ListSandboxes(t.Context())
	known := map[string]bool{}
	for _, r := range recs {
		known[r.Engine()] = true
	}
	var out []string
	for _, id := range ids {
		if !known[id] && !e.eng.Started(t.Context(), id) {
			continue // prepared, in the pool
		}
		if !known[id] {
			out = append(out, id)
		}
	}
	return out
}

// recordingHook counts the hook calls per sandbox.
type recordingHook struct {
	mu                          sync.Mutex
	before, after, stop, remove map[string]int
	failBefore                  error
}

func (h *recordingHook) Name() string { return "recorder" }
func (h *recordingHook) inc(m *map[string]int, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[id]++
}
func (h *recordingHook) count(m map[string]int, id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return m[id]
}
func (h *recordingHook) BeforeStart(_ context.Context, rec store.Sandbox, spec *engine.Spec) error {
	h.inc(&h.before, rec.ID)
	return h.failBefore
}
func (h *recordingHook) AfterStart(_ context.Context, rec store.Sandbox, _ engine.Sandbox) error {
	h.inc(&h.after, rec.ID)
	return nil
}
func (h *recordingHook) AfterStop(_ context.Context, rec store.Sandbox) error {
	h.inc(&h.stop, rec.ID)
	return nil
}
func (h *recordingHook) AfterRemove(_ context.Context, rec store.Sandbox) error {
	h.inc(&h.remove, rec.ID)
	return nil
}
func (h *recordingHook) Reconcile(context.Context, []store.Sandbox, []store.Sandbox) error {
	return nil
}

func TestTransitionTable(t *testing.T) {
	states := map[string]bool{}
	for from := range transitions {
		states[from] = true
	}
	for from, tos := range transitions {
		for _, to := range tos {
			if !states[to] {
				t.Errorf("%s -> %s: %s is not a state of the table", from, to, to)
			}
		}
	}
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{store.StateRunning, store.StateSuspending, true},
		{store.StateSleeping, store.StateRunning, false}, // only through waking
		{store.StateStopped, store.StateRunning, false},
		{store.StateDestroying, store.StateRunning, false},
		{store.StateCreating, store.StateSleeping, false},
	} {
		if got := canMove(c.from, c.to); got != c.ok {
			t.Errorf("canMove(%s, %s) = %v, want %v", c.from, c.to, got, c.ok)
		}
	}
}

func TestMoveChecksTheStoredState(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	stale := sb
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	// stale still says running: the store says sleeping.
	err := e.m.moveLocked(t.Context(), &stale, store.StateSuspending, "")
	if !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("a move from a stale state: got %v, want Conflict", err)
	}
	err = e.m.moveLocked(t.Context(), &store.Sandbox{ID: sb.ID, State: store.StateSleeping}, store.StateRunning, "")
	if !errdefs.Is(err, errdefs.Internal) {
		t.Fatalf("a move the table forbids: got %v, want Internal", err)
	}
}

func TestCreateAndDestroy(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if sb.State != store.StateRunning || sb.CreatedAt.IsZero() {
		t.Fatalf("created record: state %s, created_at %v", sb.State, sb.CreatedAt)
	}
	if !e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("the engine does not run the created sandbox")
	}
	if e.hook.count(e.hook.before, sb.ID) != 1 || e.hook.count(e.hook.after, sb.ID) != 1 {
		t.Fatal("hooks before and after start were not called once each")
	}
	if err := e.m.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if e.state(t, sb.ID) != "gone" || e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("destroy left the record or the engine sandbox")
	}
	if e.hook.count(e.hook.stop, sb.ID) != 1 || e.hook.count(e.hook.remove, sb.ID) != 1 {
		t.Fatal("hooks after stop and after remove were not called once each")
	}
	if err := e.m.Destroy(t.Context(), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second destroy: %v, want NotFound", err)
	}
	if n := e.m.locks.len(); n != 0 {
		t.Fatalf("%d per-id locks left behind", n)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	for name, setup := range map[string]func(e *env){
		"engine": func(e *env) { e.eng.OnCreate = func(engine.Spec) error { return fake.ErrInjected } },
		"hook":   func(e *env) { e.hook.failBefore = fake.ErrInjected },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Config{})
			setup(e)
			_, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
			if !errors.Is(err, fake.ErrInjected) {
				t.Fatalf("create: %v, want the injected failure", err)
			}
			if recs, _ := e.st.ListSandboxes(t.Context()); len(recs) != 0 {
				t.Fatalf("a failed create left %d records", len(recs))
			}
			if ids, _ := e.eng.List(t.Context()); len(ids) != 0 {
				t.Fatalf("a failed create left engine sandboxes %v", ids)
			}
			e.hook.mu.Lock()
			stops := len(e.hook.stop)
			e.hook.mu.Unlock()
			if stops != 1 {
				t.Fatalf("AfterStop ran for %d sandboxes, want 1", stops)
			}
		})
	}
}

// TestFailedCreateOnAFullDiskLeavesNothingOnceThereIsRoom: a create that
// fails on a full disk cannot delete its record at once; it must go by
// itself once there is room (the soak saw one left "creating").
func TestFailedCreateOnAFullDiskLeavesNothingOnceThereIsRoom(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	e := newEnvDB(t, Config{}, filepath.Join(dbDir, "clade.db"))
	var filler string
	e.eng.OnCreate = func(engine.Spec) error {
		filler = fillDisk(t, dbDir)
		return fake.ErrInjected
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{Name: "doomed", Image: testImage, MemoryMiB: 128}); !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("create: %v, want the injected failure", err)
	}
	if filler == "" {
		t.Fatal("the engine's create was not reached")
	}
	recs, _ := e.st.ListSandboxes(t.Context())
	if len(recs) != 1 {
		t.Skipf("the full disk did not keep the record (%d records): nothing to settle", len(recs))
	}
	os.Remove(filler)
	deadline := time.Now().Add(time.Minute)
	for {
		recs, err := e.st.ListSandboxes(t.Context())
		if err == nil && len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with room again the failed create's record is still there: %+v %v", recs, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the record until the retry lands
	}
	// The name is free again.
	if _, err := e.m.Create(t.Context(), CreateRequest{Name: "doomed", Image: testImage, MemoryMiB: 128}); err == nil {
		t.Fatal("the engine hook should still fail the create")
	} else if errdefs.Is(err, errdefs.AlreadyExists) {
		t.Fatalf("the name is still taken: %v", err)
	}
}

// TestFailedWakeOnAFullDiskSettlesAsleep: a wake that fails on a full
// disk cannot record the sandbox asleep again at once; it must be, by
// itself, once there is room (the soak saw one left "waking").
func TestFailedWakeOnAFullDiskSettlesAsleep(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	e := newEnvDB(t, Config{}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	var filler string
	e.eng.OnRestore = func(engine.Spec) error {
		filler = fillDisk(t, dbDir)
		return fake.ErrInjected
	}
	if _, err := e.m.Wake(t.Context(), sb.ID); !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("wake: %v, want the injected failure", err)
	}
	if got := e.state(t, sb.ID); got != store.StateWaking {
		t.Skipf("the full disk did not keep the record waking (%s): nothing to settle", got)
	}
	e.eng.OnRestore = nil
	os.Remove(filler)
	deadline := time.Now().Add(time.Minute)
	for e.state(t, sb.ID) != store.StateSleeping {
		if time.Now().After(deadline) {
			t.Fatalf("with room again the sandbox is still %s, want sleeping", e.state(t, sb.ID))
		}
		time.Sleep(50 * time.Millisecond) // polling the record until the retry lands
	}
	if _, err := e.m.Wake(t.Context(), sb.ID); err != nil {
		t.Fatalf("wake after settling: %v", err)
	}
}

func TestAdmissionOvercommit(t *testing.T) {
	total, err := memTotalMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	// Room for exactly four 512 MiB sandboxes.
	e := newEnv(t, Config{MemoryOvercommit: 2048.0 / float64(total)})
	var ids []string
	for range 4 {
		ids = append(ids, e.create(t, 512).ID)
	}
	_, err = e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 512})
	if !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("a fifth sandbox: %v, want Unavailable (overcommit)", err)
	}
	if e.m.Counters().AdmissionRefused.Load() != 1 {
		t.Fatal("the refusal was not counted")
	}
	// A sleeping sandbox holds no memory: its limit no longer counts.
	if _, err := e.m.Sleep(t.Context(), ids[0]); err != nil {
		t.Fatal(err)
	}
	e.create(t, 512)
	// And waking it is admitted like a create: refused now.
	if _, err := e.m.Wake(t.Context(), ids[0]); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("wake past the ratio: %v, want Unavailable", err)
	}
	if e.state(t, ids[0]) != store.StateSleeping {
		t.Fatal("a refused wake did not leave the sandbox asleep")
	}
}

func TestFailedSleepKeepsTheSandboxRunning(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	e.eng.OnCheckpoint = func(string) error { return errdefs.New(errdefs.ResourceExhausted, "no space left on device") }
	_, err := e.m.Sleep(t.Context(), sb.ID)
	if !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("sleep: %v, want the engine's ResourceExhausted", err)
	}
	if e.state(t, sb.ID) != store.StateRunning {
		t.Fatalf("after a failed sleep the sandbox is %s", e.state(t, sb.ID))
	}
	if _, err := e.m.running(t.Context(), sb.ID, true); err != nil {
		t.Fatalf("after a failed sleep the sandbox does not serve: %v", err)
	}
	execOK(t, e.m, sb.ID, "after a failed sleep")
	if _, err := os.Stat(e.m.cfg.sleepDir(sb.ID)); !os.IsNotExist(err) {
		t.Fatal("a failed sleep left its partial image")
	}
}

// TestFailedSleepOnAFullDisk: the checkpoint fails for want of space and
// the store cannot even record the rollback to running at first; the
// sandbox must come back as running, not stay "suspending", once the disk
// has room again (the chaos soak's lost sandbox).
func TestFailedSleepOnAFullDisk(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	warned := make(chan struct{}, 1)
	log := slog.New(&notifyHandler{msg: "the database cannot record a rollback", c: warned})
	e := newEnvDB(t, Config{Log: log}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	e.eng.OnCheckpoint = func(string) error {
		fillDisk(t, dbDir)
		return errdefs.New(errdefs.ResourceExhausted, "no space left on device")
	}
	go func() {
		<-warned // the rollback found the disk full: make room
		os.Remove(filepath.Join(dbDir, "filler"))
	}()
	if _, err := e.m.Sleep(t.Context(), sb.ID); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("sleep: %v, want ResourceExhausted", err)
	}
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("after a sleep that failed on a full disk the sandbox is %s, want running", got)
	}
	if _, err := e.m.running(t.Context(), sb.ID, true); err != nil {
		t.Fatalf("the sandbox does not serve: %v", err)
	}
}

// TestEngineFailureOnAFullDiskSaysSo: runsc's failures on a full disk
// ("exit status 128") reach the caller as ResourceExhausted, saying the
// disk is full.
func TestEngineFailureOnAFullDiskSaysSo(t *testing.T) {
	e := newEnv(t, Config{})
	if err := os.MkdirAll(e.cfg.SnapshotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	smallDisk(t, e.cfg.SnapshotDir, "128m")
	e.eng.OnCreate = func(engine.Spec) error { return errors.New("runsc run: exit status 128") }
	if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128}); errdefs.ClassOf(err) == errdefs.ResourceExhausted {
		t.Fatalf("with space, an engine failure was taken for a full disk: %v", err)
	}
	fillDisk(t, e.cfg.SnapshotDir)
	_, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if errdefs.ClassOf(err) != errdefs.ResourceExhausted || !strings.Contains(err.Error(), "full") {
		t.Fatalf("create on a full disk: %v (class %s), want ResourceExhausted saying the disk is full", err, errdefs.ClassOf(err))
	}
}

// TestRemoveRefusedOnAFullDiskKeepsServing: a removal the store cannot
// record changes nothing: the sandbox serves on (it was cut off from its
// agent for good: "connection is not back yet", the soak).
func TestRemoveRefusedOnAFullDiskKeepsServing(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	e := newEnvDB(t, Config{}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	fillDisk(t, dbDir)
	if err := e.m.Destroy(t.Context(), sb.ID); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("remove on a full disk: %v, want ResourceExhausted", err)
	}
	g, err := e.m.GuestWaking(t.Context(), sb.ID)
	if err != nil {
		t.Fatalf("after a refused removal: %v", err)
	}
	if err := g.Ping(t.Context()); err != nil {
		t.Fatalf("after a refused removal the guest does not answer: %v", err)
	}
}

// TestRemoveDoneOnAFullDiskLeavesOnlyItsRecord: a disk that fills after
// a removal has begun (its sandbox destroyed) cannot undo it: the removal
// succeeds, the record shows destroying, and goes once there is room,
// without a client or a restart (the soak: an rm answered "disk full"
// whose sandbox vanished later).
func TestRemoveDoneOnAFullDiskLeavesOnlyItsRecord(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	removed := &notifyHandler{msg: "sandbox removed", c: make(chan struct{}, 4)}
	e := newEnvDB(t, Config{Log: slog.New(removed)}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	var filler string
	e.eng.OnDestroy = func(string) {
		if filler == "" { // the retries destroy again
			filler = fillDisk(t, dbDir)
		}
	}
	if err := e.m.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatalf("a removal the disk filled under: %v, want done", err)
	}
	if filler == "" {
		t.Fatal("the engine sandbox was not destroyed")
	}
	if got := e.state(t, sb.ID); got != store.StateDestroying {
		t.Fatalf("on the full disk the record is %s, want destroying", got)
	}
	os.Remove(filler)
	for deadline := time.Now().Add(time.Minute); e.state(t, sb.ID) != "gone"; {
		if time.Now().After(deadline) {
			t.Fatal("with room again the record was not deleted within a minute")
		}
		select {
		case <-removed.c:
		case <-time.After(time.Second):
		}
	}
}

// TestEndBuildOnAFullDiskRetries: a build's sandbox whose removal a full
// disk refused is removed once there is room, without a client or a
// restart (the soak saw one left running after its build failed).
func TestEndBuildOnAFullDiskRetries(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	removed := &notifyHandler{msg: "removed a build's sandbox", c: make(chan struct{}, 1)}
	e := newEnvDB(t, Config{Log: slog.New(removed)}, filepath.Join(dbDir, "clade.db"))
	sb, err := e.m.Builds().CreateSandbox(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	filler := fillDisk(t, dbDir)
	if err := e.m.Builds().End(t.Context(), sb.ID); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("end a build on a full disk: %v, want ResourceExhausted", err)
	}
	if got := e.state(t, sb.ID); got != store.StateRunning {
		t.Fatalf("after a refused removal the build's sandbox is %s, want running", got)
	}
	os.Remove(filler)
	select {
	case <-removed.c:
	case <-time.After(time.Minute):
		t.Fatal("with room again the build's sandbox was not removed within a minute")
	}
	if _, err := e.st.GetSandbox(t.Context(), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("the build's sandbox after its retried removal: %v, want not found", err)
	}
	if ids, _ := e.st.BuildSandboxes(t.Context()); len(ids) != 0 {
		t.Fatalf("build sandboxes still marked: %v", ids)
	}
}

// smallDisk mounts a tmpfs of size on dir (made, if empty, by t.TempDir)
// until the test ends, and returns dir. It needs root (the daemon tests
// run as root).
func smallDisk(t *testing.T, dir, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillDisk takes every free block of dir's file system with dir/filler,
// and returns its path: removing it makes room again.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for buf := make([]byte, 64<<10); ; {
		if _, err := f.Write(buf); err != nil {
			return filler
		}
	}
}

// notifyHandler signals c when a record whose message starts with msg is
// logged.
type notifyHandler struct {
	msg string
	c   chan struct{}
}

func (h *notifyHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *notifyHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.msg) {
		select {
		case h.c <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h *notifyHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *notifyHandler) WithGroup(string) slog.Handler      { return h }

func TestSleepWakeAndRequestWakes(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if e.eng.Started(t.Context(), sb.Engine()) {
		t.Fatal("a sleeping sandbox still runs in the engine")
	}
	// The next request wakes it.
	if _, err := e.m.running(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if e.state(t, sb.ID) != store.StateRunning {
		t.Fatalf("after a request the sandbox is %s", e.state(t, sb.ID))
	}
	if e.hook.count(e.hook.stop, sb.ID) != 1 || e.hook.count(e.hook.before, sb.ID) != 2 {
		t.Fatal("sleep and wake did not run the stop and start hooks")
	}
}

func TestCorruptSleepImageStaysAsleep(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.m.cfg.sleepDir(sb.ID), "state"), []byte("flipped"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Wake(t.Context(), sb.ID); !errors.Is(err, stateimg.ErrCorrupt) {
		t.Fatalf("wake from a damaged image: %v, want corrupt", err)
	}
	if e.state(t, sb.ID) != store.StateSleeping {
		t.Fatalf("after a failed wake: %s, want sleeping", e.state(t, sb.ID))
	}
	if err := e.m.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatalf("a sandbox with a bad image must stay removable: %v", err)
	}
}

func TestSnapshotNamesAreNotIDs(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	for _, name := range []string{"0123456789abcdef", "../x", "-a", ""} {
		if name == "" {
			continue
		}
		if _, err := e.m.Snapshot(t.Context(), sb.ID, name, false); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("snapshot name %q: %v, want InvalidArgument", name, err)
		}
	}
	sn, err := e.m.Snapshot(t.Context(), sb.ID, "good-name", false)
	if err != nil {
		t.Fatal(err)
	}
	if sn.CreatedAt.IsZero() {
		t.Fatal("snapshot created_at is zero")
	}
}

func TestForkAccounting(t *testing.T) {
	e := newEnv(t, Config{})
	parent := e.create(t, 128)
	var calls sync.Mutex
	n := 0
	e.eng.OnRestore = func(engine.Spec) error {
		calls.Lock()
		defer calls.Unlock()
		n++
		if n == 2 {
			return fake.ErrInjected
		}
		return nil
	}
	res, err := e.m.Fork(t.Context(), parent.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	var ok []string
	failed := 0
	for _, c := range res.Children {
		if c.Err != nil {
			failed++
			continue
		}
		ok = append(ok, c.ID)
	}
	if len(ok) != 2 || failed != 1 {
		t.Fatalf("fork of 3 with one failing restore: %d ok, %d failed", len(ok), failed)
	}
	_, users, err := e.m.GetSnapshot(t.Context(), res.Snapshot)
	if err != nil || len(users) != 2 {
		t.Fatalf("implicit snapshot users = %v (%v), want the 2 children", users, err)
	}
	if l := e.unrecorded(t); len(l) != 0 {
		t.Fatalf("the failed child left engine sandboxes %v", l)
	}
	for _, id := range ok {
		if err := e.m.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := e.m.GetSnapshot(t.Context(), res.Snapshot); !errdefs.IsNotFound(err) {
		t.Fatalf("the implicit snapshot outlived its last child: %v", err)
	}
	if n := e.m.locks.len(); n != 0 {
		t.Fatalf("%d per-id locks left behind", n)
	}
}

func TestDeadSandboxIsMarkedStopped(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	e.eng.Kill(sb.Engine(), "the sandbox exceeded its memory limit and was killed")
	deadline := time.Now().Add(5 * time.Second)
	for e.state(t, sb.ID) != store.StateStopped {
		if time.Now().After(deadline) {
			t.Fatalf("a dead sandbox is still %s", e.state(t, sb.ID))
		}
		time.Sleep(time.Millisecond)
	}
	_, err := e.m.running(t.Context(), sb.ID, true)
	if err == nil || !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("a request to a stopped sandbox: %v", err)
	}
}

func TestConcurrentRemovesWait(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	e.eng.Delay = 20 * time.Millisecond
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.m.Destroy(t.Context(), sb.ID)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errdefs.IsNotFound(err):
		default:
			t.Errorf("a concurrent remove failed with %v (want success or NotFound)", err)
		}
	}
	if ok < 1 {
		t.Fatal("no remove succeeded")
	}
}

// TestDestroyRacesWakeAndFork runs remove against wake, and remove against
// fork, many times, then looks for engine sandboxes the store does not
// record. Before the per-id lock model, Destroy read a sleeping sandbox's
// record before taking its lock: a wake into a prepared engine sandbox (a
// new engine id) in between was left running, unrecorded.
func TestDestroyRacesWakeAndFork(t *testing.T) {
	e := newEnv(t, Config{WarmPool: 4})
	e.eng.Delay = time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	e.m.Pools().Start(ctx)
	for i := range 30 {
		sb := e.create(t, 128)
		if i%2 == 0 {
			if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			// Wake into a prepared engine sandbox: the engine id changes.
			e.m.pools.warm.Want(shapeOf(sb.Image, sb.MemoryMiB, sb.CPUs, sb.Env, sb.Opts), 1)
			for deadline := time.Now().Add(5 * time.Second); e.m.Pools().Warm() == 0; {
				if time.Now().After(deadline) {
					t.Fatal("the pool prepared nothing")
				}
				time.Sleep(time.Millisecond)
			}
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_, _ = e.m.Wake(t.Context(), sb.ID)
			} else {
				res, err := e.m.Fork(t.Context(), sb.ID, 2)
				if err == nil {
					for _, c := range res.Children {
						if c.ID != "" {
							_ = e.m.Destroy(t.Context(), c.ID)
						}
					}
				}
			}
		}()
		go func() {
			defer wg.Done()
			if err := e.m.Destroy(t.Context(), sb.ID); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("destroy: %v", err)
			}
		}()
		wg.Wait()
		if l := e.unrecorded(t); len(l) != 0 {
			t.Fatalf("round %d: engine sandboxes nobody records: %v", i, l)
		}
	}
	if recs, _ := e.st.ListSandboxes(t.Context()); len(recs) != 0 {
		t.Fatalf("%d sandboxes left", len(recs))
	}
	if snaps, _ := e.st.ListSnapshots(t.Context()); len(snaps) != 0 {
		t.Fatalf("%d snapshots left", len(snaps))
	}
}

// TestReconcileOnAFullDiskSettlesLater: a wake cut short by a crash, and
// a restart on a full disk that cannot record "sleeping" again: the sleep
// image must stay, and the sandbox must settle asleep once there is room
// (the soak's sandbox left "waking").
func TestReconcileOnAFullDiskSettlesLater(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	e := newEnvDB(t, Config{}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	setState(t, e, sb.ID, store.StateWaking) // the crash: mid-wake
	filler := fillDisk(t, dbDir)
	cfg := e.cfg
	cfg.MemoryFloorMiB, cfg.PressureFloorMiB = 1, -1
	e.m = New(cfg, e.eng, e.st, e.imgs)
	if err := e.m.Reconcile(t.Context()); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("reconcile on a full disk: %v, want ResourceExhausted", err)
	}
	if !imageSealed(e.m.cfg.sleepDir(sb.ID)) {
		t.Fatal("the restart removed the sleep image of a sandbox it could not settle")
	}
	os.Remove(filler)
	deadline := time.Now().Add(time.Minute)
	for e.state(t, sb.ID) != store.StateSleeping {
		if time.Now().After(deadline) {
			t.Fatalf("with room again the sandbox is still %s, want sleeping", e.state(t, sb.ID))
		}
		time.Sleep(50 * time.Millisecond) // polling the record until the retry lands
	}
	if _, err := e.m.Wake(t.Context(), sb.ID); err != nil {
		t.Fatalf("wake after settling: %v", err)
	}
}

func TestReconcileDecisions(t *testing.T) {
	e := newEnv(t, Config{})
	running := e.create(t, 128)
	gone := e.create(t, 128)
	e.eng.Kill(gone.Engine(), "") // died while no daemon watched
	asleep := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), asleep.ID); err != nil {
		t.Fatal(err)
	}
	// A sleep cut short after the image was sealed, before the record moved.
	sealed := e.create(t, 128)
	if err := e.eng.Checkpoint(t.Context(), sealed.Engine(), e.m.cfg.sleepDir(sealed.ID), true); err != nil {
		t.Fatal(err)
	}
	if err := sealImage(e.m.cfg.sleepDir(sealed.ID)); err != nil {
		t.Fatal(err)
	}
	setState(t, e, sealed.ID, store.StateSuspending)
	// A sleep cut short before the image was sealed: the sandbox runs on.
	unsealed := e.create(t, 128)
	_ = os.MkdirAll(e.m.cfg.sleepDir(unsealed.ID), 0o700)
	_ = os.WriteFile(filepath.Join(e.m.cfg.sleepDir(unsealed.ID), "pages.img"), []byte("partial"), 0o600)
	setState(t, e, unsealed.ID, store.StateSuspending)
	// A create cut short.
	half := e.create(t, 128)
	setState(t, e, half.ID, store.StateCreating)
	// Engine sandboxes nobody records: one started (kept), one prepared.
	if _, err := e.eng.Create(t.Context(), engine.Spec{ID: "aaaaaaaaaaaaaaaa"}); err != nil {
		t.Fatal(err)
	}
	_ = e.eng.Prepare(t.Context(), engine.Spec{ID: "bbbbbbbbbbbbbbbb"})

	e.restart(t, Config{})
	for id, want := range map[string]string{
		running.ID: store.StateRunning, gone.ID: store.StateStopped, asleep.ID: store.StateSleeping,
		sealed.ID: store.StateSleeping, unsealed.ID: store.StateRunning, half.ID: "gone",
	} {
		if got := e.state(t, id); got != want {
			t.Errorf("sandbox %s: %s after reconcile, want %s", id, got, want)
		}
	}
	if e.eng.Started(t.Context(), sealed.Engine()) {
		t.Error("a sealed sleep's engine sandbox still runs")
	}
	if _, err := os.Stat(e.m.cfg.sleepDir(unsealed.ID)); !os.IsNotExist(err) {
		t.Error("a running sandbox kept its partial sleep image")
	}
	ids, _ := e.eng.List(t.Context())
	has := map[string]bool{}
	for _, id := range ids {
		has[id] = true
	}
	if !has["aaaaaaaaaaaaaaaa"] {
		t.Error("an unrecorded started sandbox was destroyed without --destroy-unrecorded")
	}
	if has["bbbbbbbbbbbbbbbb"] {
		t.Error("an unrecorded prepared sandbox was kept")
	}
	e.restart(t, Config{DestroyUnrecorded: true})
	if e.eng.Started(t.Context(), "aaaaaaaaaaaaaaaa") {
		t.Error("--destroy-unrecorded kept an unrecorded sandbox")
	}
	if _, err := e.m.running(t.Context(), running.ID, true); err != nil {
		t.Errorf("a reattached sandbox does not serve: %v", err)
	}
}

func setState(t *testing.T, e *env, id, state string) {
	t.Helper()
	if err := e.st.SetState(t.Context(), id, state, ""); err != nil {
		t.Fatal(err)
	}
}

func TestPressureSleepsLeastRecentlyUsed(t *testing.T) {
	old, oldGrace := idleAfter, lookupGrace
	idleAfter, lookupGrace = 0, 0
	t.Cleanup(func() { idleAfter, lookupGrace = old, oldGrace })
	e := newEnv(t, Config{})
	a := e.create(t, 128)
	b := e.create(t, 128)
	// b was used last: a is the least recently used.
	if _, err := e.m.running(t.Context(), b.ID, true); err != nil {
		t.Fatal(err)
	}
	snapper, _ := snapshotterOf(e.m.eng)
	lru := e.m.traffic.idleLRU()
	if len(lru) != 2 || lru[0] != a.ID {
		t.Fatalf("idle LRU order = %v, want %s first", lru, a.ID)
	}
	if !e.m.lifetimes.sleepForPressure(t.Context(), snapper, lru[0], 0) {
		t.Fatal("the pressure sleeper did not sleep an idle sandbox")
	}
	if e.state(t, a.ID) != store.StateSleeping || e.state(t, b.ID) != store.StateRunning {
		t.Fatalf("after one pressure sleep: a %s, b %s", e.state(t, a.ID), e.state(t, b.ID))
	}
	if e.m.Counters().PressureSleeps.Load() != 1 {
		t.Fatal("the pressure sleep was not counted")
	}
}

func TestStoreReplacedRefusesWrites(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	path := filepath.Join(filepath.Dir(e.cfg.SnapshotDir), "clade.db")
	if err := os.Rename(path, path+".moved"); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("create with the database gone: %v, want Unavailable", err)
	}
	if ids, _ := e.eng.List(t.Context()); len(ids) != 1 {
		t.Fatalf("a refused create left engine sandboxes: %v", ids)
	}
	if e.state(t, sb.ID) != store.StateRunning {
		t.Fatal("the existing sandbox's record changed")
	}
}
