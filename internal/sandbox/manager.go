// Package sandbox is clade's lifecycle manager: it validates requests, records
// every transition in the store before and after the engine call, keeps the
// live sandboxes' agent connections, and after a restart reconciles what the
// store says with what the engine has.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// Config holds the manager's limits and defaults.
type Config struct {
	DefaultMemoryMiB int
	MaxMemoryMiB     int
	DefaultCPUs      float64
	MaxCPUs          float64
	Log              *slog.Logger
	// CrashAt names a point at which the process kills itself with
	// SIGKILL, for tests of restart safety (e.g. "create-after-engine").
	CrashAt string
	// SnapshotDir holds snapshots, SleepDir the images of sleeping sandboxes.
	SnapshotDir string
	SleepDir    string
	// MaxFork caps the children of one fork.
	MaxFork int
	// MemoryFloorMiB is the free memory (MemAvailable) that creates, forks
	// and wakes must leave on the host.
	MemoryFloorMiB int
	// WarmPool caps the prepared sandboxes kept per shape (0: none);
	// WarmCreate is how many are kept for plain creates of the defaults.
	WarmPool   int
	WarmCreate int
	// RestoreParallel bounds the restores of one fork that run at once;
	// twice the core count when zero. Restores are mostly CPU, but each also
	// waits on process starts and the agent: on 2 cores, 4 at once forked 16
	// children ~15% faster than 2 (1.18 vs 1.39 s p50, interleaved runs).
	RestoreParallel int
	// Hooks attach features to the lifecycle, called in order.
	Hooks []Hook
}

// DefaultConfig returns sensible limits for this host.
func DefaultConfig() Config {
	floor := 1024
	if total, err := memTotalMiB(); err == nil {
		floor = max(512, total/20)
	}
	return Config{DefaultMemoryMiB: 512, MaxMemoryMiB: 64 << 10, DefaultCPUs: 1, MaxCPUs: float64(runtime.NumCPU()),
		MaxFork: 128, MemoryFloorMiB: floor, WarmPool: 16, WarmCreate: 2}
}

// Manager owns sandboxes.
type Manager struct {
	cfg    Config
	eng    engine.Engine
	store  *store.Store
	images *image.Store
	log    *slog.Logger

	mu          sync.Mutex
	live        map[string]engine.Sandbox
	busy        map[string]bool // ids with a create or destroy in flight
	ops         map[string]*sync.Mutex
	reservedMiB int // memory admitted for sandboxes still being made
	pool        *warmPool
	imageMu     sync.Mutex // image removal against creates that use the image
}

// New returns a manager. Call Reconcile before serving.
func New(cfg Config, eng engine.Engine, st *store.Store, images *image.Store) *Manager {
	d := DefaultConfig()
	if cfg.DefaultMemoryMiB == 0 {
		cfg.DefaultMemoryMiB = d.DefaultMemoryMiB
	}
	if cfg.MaxMemoryMiB == 0 {
		cfg.MaxMemoryMiB = d.MaxMemoryMiB
	}
	if cfg.DefaultCPUs == 0 {
		cfg.DefaultCPUs = d.DefaultCPUs
	}
	if cfg.MaxCPUs == 0 {
		cfg.MaxCPUs = d.MaxCPUs
	}
	if cfg.RestoreParallel == 0 {
		cfg.RestoreParallel = 2 * runtime.NumCPU()
	}
	if cfg.WarmCreate == 0 {
		cfg.WarmCreate = d.WarmCreate
	}
	if cfg.MaxFork == 0 {
		cfg.MaxFork = d.MaxFork
	}
	if cfg.MemoryFloorMiB == 0 {
		cfg.MemoryFloorMiB = d.MemoryFloorMiB
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, eng: eng, store: st, images: images, log: cfg.Log,
		live: map[string]engine.Sandbox{}, busy: map[string]bool{}, ops: map[string]*sync.Mutex{}, pool: newWarmPool()}
	return m
}

// Engine returns the manager's engine.
func (m *Manager) Engine() engine.Engine { return m.eng }

// CreateRequest asks for a new sandbox. Zero values take the defaults.
type CreateRequest struct {
	Name      string
	Image     string
	MemoryMiB int
	CPUs      float64
	Env       []string
	// FromSnapshot restores the sandbox from a snapshot instead of booting.
	FromSnapshot string
	// Network is the network mode and egress policy; nil takes the
	// daemon's default.
	Network *store.NetworkOptions
}

// MinMemoryMiB is the smallest memory limit a sandbox can boot with.
const MinMemoryMiB = 64

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// IDLength is the length of every sandbox id: runsc matches ids by prefix, so
// they must all be the same length.
const IDLength = 16

func newID() string {
	b := make([]byte, IDLength/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func isID(s string) bool {
	if len(s) != IDLength {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func (m *Manager) validate(req *CreateRequest) error {
	if req.Name != "" {
		if !nameRE.MatchString(req.Name) {
			return errdefs.New(errdefs.InvalidArgument, "bad name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", req.Name)
		}
		if isID(req.Name) {
			return errdefs.New(errdefs.InvalidArgument, "bad name %q: it looks like a sandbox id; pick a name that is not 16 hex digits", req.Name)
		}
	}
	if req.Image == "" {
		req.Image = image.Default
	}
	if req.MemoryMiB == 0 {
		req.MemoryMiB = m.cfg.DefaultMemoryMiB
	}
	if req.MemoryMiB < MinMemoryMiB || req.MemoryMiB > m.cfg.MaxMemoryMiB {
		return errdefs.New(errdefs.InvalidArgument, "memory %d MiB is out of range: use %d to %d MiB", req.MemoryMiB, MinMemoryMiB, m.cfg.MaxMemoryMiB)
	}
	if req.CPUs == 0 {
		req.CPUs = m.cfg.DefaultCPUs
	}
	if req.CPUs < 0.01 || req.CPUs > m.cfg.MaxCPUs {
		return errdefs.New(errdefs.InvalidArgument, "cpus %g is out of range: use 0.01 to %g", req.CPUs, m.cfg.MaxCPUs)
	}
	for _, kv := range req.Env {
		if err := ValidEnv(kv); err != nil {
			return err
		}
	}
	opts := store.Options{Network: req.Network}
	if err := m.completeOptions(&opts); err != nil {
		return err
	}
	req.Network = opts.Network
	return nil
}

// ValidEnv checks one KEY=VALUE pair.
func ValidEnv(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.Contains(kv, "\x00") {
		return errdefs.New(errdefs.InvalidArgument, "bad environment variable %q: use KEY=VALUE", kv)
	}
	return nil
}

// Create makes a running sandbox. A failed create leaves nothing behind.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	if req.FromSnapshot != "" {
		return m.createFrom(ctx, req)
	}
	if err := m.validate(&req); err != nil {
		return store.Sandbox{}, err
	}
	release, err := m.admit(req.MemoryMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	// Held until the record exists: an image removal checks the records.
	m.imageMu.Lock()
	imageLocked := true
	defer func() {
		if imageLocked {
			m.imageMu.Unlock()
		}
	}()
	img, err := m.images.Get(ctx, req.Image)
	if err != nil {
		return store.Sandbox{}, err
	}
	if img.Snapshot != "" && len(req.Env) == 0 {
		// A template: restore its ready snapshot (start command already
		// running) when the sandbox asks for the snapshot's resources.
		if sn, err := m.store.GetSnapshot(ctx, img.Snapshot); err == nil && sn.MemoryMiB == req.MemoryMiB && sn.CPUs == req.CPUs &&
			shapeOf("", 0, 0, nil, sn.Opts.Network) == shapeOf("", 0, 0, nil, req.Network) {
			m.imageMu.Unlock()
			imageLocked = false
			release()
			return m.createFromSnapshot(ctx, sn.ID, req.Name, req.Network)
		}
	}
	sh := shapeOf(img.Name, req.MemoryMiB, req.CPUs, req.Env, req.Network)
	id, ok := m.pool.take(sh)
	if !ok {
		id = newID()
	}
	defer m.pool.want(sh, 0, 0) // refill what was taken
	rec := store.Sandbox{ID: id, Name: req.Name, Image: img.Name, State: store.StateCreating,
		MemoryMiB: req.MemoryMiB, CPUs: req.CPUs, Env: req.Env, RootFS: img.RootFS, Opts: store.Options{Network: req.Network}}
	defer m.markBusy(rec.ID)()
	if err := m.store.InsertSandbox(ctx, rec); err != nil {
		return store.Sandbox{}, err
	}
	m.imageMu.Unlock()
	imageLocked = false
	// The create runs to the end even if the client goes away: a half-made
	// sandbox would only have to be cleaned up again.
	ctx = context.WithoutCancel(ctx)
	m.crashPoint("create-before-engine")
	spec := m.spec(rec, img)
	err = m.beforeStart(ctx, rec, &spec)
	var sb engine.Sandbox
	if err == nil {
		sb, err = m.eng.Create(ctx, spec)
		m.crashPoint("create-after-engine")
		if err == nil {
			if err = m.afterStart(ctx, rec, sb); err != nil {
				err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()))
			}
		}
		if err != nil {
			err = errors.Join(err, m.afterStop(ctx, rec))
		}
	}
	if err != nil {
		if derr := m.store.DeleteSandbox(ctx, rec.ID); derr != nil {
			err = errors.Join(err, derr)
		}
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := m.store.SetState(ctx, rec.ID, store.StateRunning, ""); err != nil {
		return store.Sandbox{}, errors.Join(err, m.eng.Destroy(ctx, rec.Engine()), m.store.DeleteSandbox(ctx, rec.ID))
	}
	m.track(rec.ID, sb)
	rec.State = store.StateRunning
	m.log.Info("sandbox created", "sandbox", rec.ID, "name", rec.Name, "image", rec.Image)
	return rec, nil
}

// markBusy marks a sandbox as being made, so a remove waits for it to be
// whole; the returned func unmarks it.
func (m *Manager) markBusy(id string) func() {
	m.mu.Lock()
	m.busy[id] = true
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.busy, id)
		m.mu.Unlock()
	}
}

// createFrom makes one sandbox restored from a snapshot: a fork of one.
func (m *Manager) createFrom(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	if req.Image != "" || req.MemoryMiB != 0 || req.CPUs != 0 || len(req.Env) != 0 || req.Network != nil {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "a sandbox restored from a snapshot takes the snapshot's image, memory, cpus, env and network: give only a name")
	}
	if req.Name != "" {
		if err := m.validate(&CreateRequest{Name: req.Name}); err != nil {
			return store.Sandbox{}, err
		}
	}
	return m.createFromSnapshot(ctx, req.FromSnapshot, req.Name, nil)
}

// createFromSnapshot restores one sandbox; network, when set, replaces the
// snapshot's network options (same mode).
func (m *Manager) createFromSnapshot(ctx context.Context, snapshot, name string, network *store.NetworkOptions) (store.Sandbox, error) {
	res, err := m.fork(ctx, snapshot, []store.Sandbox{{Name: name, Opts: store.Options{Network: network}}})
	if err != nil {
		return store.Sandbox{}, err
	}
	if c := res.Children[0]; c.Err != nil {
		return store.Sandbox{}, c.Err
	}
	return m.store.GetSandbox(ctx, res.Children[0].ID)
}

// spec is the engine's view of a sandbox of img: the image's environment
// under the sandbox's own, and the image's working directory and user as
// the defaults of every exec.
func (m *Manager) spec(rec store.Sandbox, img image.Image) engine.Spec {
	host := rec.Name
	if host == "" {
		host = "sb-" + rec.ID[:8]
	}
	rootfs := rec.RootFS // the root it was made on, which outlives image replacements
	if rootfs == "" {
		rootfs = img.RootFS
	}
	return engine.Spec{ID: rec.Engine(), RootFS: rootfs, Hostname: host, MemoryMiB: rec.MemoryMiB, CPUs: rec.CPUs, DiskMiB: rec.Opts.DiskMiB,
		Env: append(append([]string(nil), img.Config.Env...), rec.Env...), Workdir: img.Config.WorkingDir, User: img.Config.User}
}

// Get returns a sandbox by id or name.
func (m *Manager) Get(ctx context.Context, ref string) (store.Sandbox, error) {
	return m.store.GetSandbox(ctx, ref)
}

// List returns every sandbox.
func (m *Manager) List(ctx context.Context) ([]store.Sandbox, error) {
	return m.store.ListSandboxes(ctx)
}

// agentOf returns the agent client of a running sandbox.
func (m *Manager) agentOf(ctx context.Context, ref string) (*agent.Client, error) {
	// The hot path: a running sandbox by id needs no database read.
	m.mu.Lock()
	sb := m.live[ref]
	m.mu.Unlock()
	if sb != nil {
		return sb.Agent(), nil
	}
	rec, err := m.store.GetSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if rec.State == store.StateSleeping {
		// The next request wakes a sleeping sandbox.
		if _, err := m.Wake(ctx, rec.ID); err != nil {
			return nil, err
		}
		rec.State = store.StateRunning
	}
	m.mu.Lock()
	sb = m.live[rec.ID]
	m.mu.Unlock()
	if sb == nil || rec.State != store.StateRunning {
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running", ref, rec.State)
	}
	return sb.Agent(), nil
}

// Open starts a request (exec or file transfer) in a running sandbox.
func (m *Manager) Open(ctx context.Context, ref string, req wire.Request) (*agent.Channel, error) {
	c, err := m.agentOf(ctx, ref)
	if err != nil {
		return nil, err
	}
	// A sandbox whose agent is reconnecting gets a moment to come back.
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Open(octx, req)
}

// Destroy removes a sandbox and everything it holds. It is safe to repeat.
func (m *Manager) Destroy(ctx context.Context, ref string) error {
	rec, err := m.store.GetSandbox(ctx, ref)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.busy[rec.ID] {
		m.mu.Unlock()
		return errdefs.New(errdefs.Conflict, "sandbox %s is busy being created or removed; retry", ref)
	}
	m.busy[rec.ID] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.busy, rec.ID)
		m.mu.Unlock()
	}()
	unlock := m.lockOp(rec.ID)
	defer func() {
		unlock()
		m.mu.Lock()
		delete(m.ops, rec.ID)
		m.mu.Unlock()
	}()
	m.mu.Lock()
	delete(m.live, rec.ID)
	m.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	if err := m.destroy(ctx, rec); err != nil {
		return err
	}
	m.gcSnapshot(ctx, rec.Snapshot)
	m.gcStaleRoot(ctx, rec.Image, rec.RootFS)
	return nil
}

func (m *Manager) destroy(ctx context.Context, rec store.Sandbox) error {
	id := rec.ID
	if err := m.store.SetState(ctx, id, store.StateDestroying, ""); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	m.crashPoint("destroy-before-engine")
	if err := m.eng.Destroy(ctx, rec.Engine()); err != nil {
		_ = m.store.SetState(ctx, id, store.StateDestroying, err.Error())
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if err := errors.Join(m.afterStop(ctx, rec), m.afterRemove(ctx, rec)); err != nil {
		_ = m.store.SetState(ctx, id, store.StateDestroying, err.Error())
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if err := os.RemoveAll(m.sleepDir(id)); err != nil {
		return err
	}
	m.crashPoint("destroy-after-engine")
	if err := m.store.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	m.log.Info("sandbox removed", "sandbox", id)
	return nil
}

// Reconcile makes the engine and the store agree after a start: half-done
// creates are rolled back, half-done removals finished, running sandboxes
// reattached, and engine resources nobody records are destroyed.
func (m *Manager) Reconcile(ctx context.Context) error {
	recs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	addErr := func(errs2 ...error) {
		emu.Lock()
		errs = append(errs, errs2...)
		emu.Unlock()
	}
	for _, rec := range recs {
		known[rec.Engine()] = true
		switch rec.State {
		case store.StateCreating, store.StateDestroying:
			m.log.Info("reconcile: removing half-done sandbox", "sandbox", rec.ID, "state", rec.State)
			if err := m.destroy(ctx, rec); err != nil {
				addErr(err)
			}
		case store.StateSleeping:
			if _, err := os.Stat(filepath.Join(m.sleepDir(rec.ID), completeMarker)); err != nil {
				addErr(m.store.SetState(ctx, rec.ID, store.StateStopped, "its sleep image is missing"))
			}
		case store.StateSuspending:
			// A sleep cut short: asleep if the image is whole, else running
			// on if the engine still has it.
			if _, err := os.Stat(filepath.Join(m.sleepDir(rec.ID), completeMarker)); err == nil {
				addErr(m.eng.Destroy(ctx, rec.Engine()), m.store.SetState(ctx, rec.ID, store.StateSleeping, ""))
				continue
			}
			addErr(os.RemoveAll(m.sleepDir(rec.ID)))
			rec.State = store.StateRunning
			addErr(m.store.SetState(ctx, rec.ID, store.StateRunning, ""))
			fallthrough
		case store.StateRunning, store.StateWaking:
			wg.Add(1)
			go func() {
				defer wg.Done()
				img, err := m.images.Get(ctx, rec.Image)
				var sb engine.Sandbox
				if err == nil {
					sb, err = m.eng.Attach(ctx, m.spec(rec, img))
				}
				if err != nil && rec.State == store.StateWaking {
					// The wake did not finish: still asleep.
					_ = m.eng.Destroy(ctx, rec.Engine())
					addErr(m.store.SetState(ctx, rec.ID, store.StateSleeping, ""))
					return
				}
				if err == nil && rec.State == store.StateWaking {
					_ = os.RemoveAll(m.sleepDir(rec.ID))
					err = m.store.SetState(ctx, rec.ID, store.StateRunning, "")
				}
				if err != nil {
					m.log.Warn("reconcile: sandbox is gone", "sandbox", rec.ID, "err", err)
					_ = m.eng.Destroy(ctx, rec.Engine())
					if serr := m.store.SetState(ctx, rec.ID, store.StateStopped, err.Error()); serr != nil {
						addErr(serr)
					}
					return
				}
				m.track(rec.ID, sb)
				m.log.Info("reconcile: reattached", "sandbox", rec.ID)
			}()
		}
	}
	wg.Wait()
	sleeping := map[string]bool{}
	if recs, err := m.store.ListSandboxes(ctx); err == nil {
		for _, rec := range recs {
			if rec.State == store.StateSleeping {
				sleeping[rec.ID] = true
			}
		}
	}
	addErr(removeUnknown(m.cfg.SleepDir, sleeping), m.reconcileSnapshots(ctx))
	if all, err := m.store.ListSandboxes(ctx); err != nil {
		addErr(err)
	} else {
		var running []store.Sandbox
		for _, rec := range all {
			if rec.State == store.StateRunning {
				running = append(running, rec)
			}
		}
		for _, h := range m.cfg.Hooks {
			if err := h.Reconcile(ctx, running, all); err != nil {
				addErr(fmt.Errorf("%s: %w", h.Name(), err))
			}
		}
	}
	m.gcRoots(ctx)
	ids, err := m.eng.List(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, id := range ids {
		if !known[id] {
			m.log.Info("reconcile: destroying unrecorded engine sandbox", "sandbox", id)
			if err := m.eng.Destroy(ctx, id); err != nil {
				addErr(err)
			}
		}
	}
	return errors.Join(errs...)
}

// Close drops the agent connections; sandboxes keep running for the next
// daemon to reattach.
func (m *Manager) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.drainPool(ctx)
	_ = m.eng.Close()
}

// crashPoint kills the process at the named point when configured to.
func (m *Manager) crashPoint(name string) {
	if m.cfg.CrashAt == name {
		m.log.Warn("crashing on purpose", "point", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// track makes sb live and marks it stopped if it dies by itself.
func (m *Manager) track(id string, sb engine.Sandbox) {
	m.mu.Lock()
	m.live[id] = sb
	m.mu.Unlock()
	go func() {
		<-sb.Exited()
		reason := sb.ExitReason()
		if reason == "" {
			return
		}
		m.mu.Lock()
		if m.live[id] == sb {
			delete(m.live, id)
		}
		m.mu.Unlock()
		m.log.Warn("sandbox stopped", "sandbox", id, "reason", reason)
		if err := m.store.SetState(context.Background(), id, store.StateStopped, reason); err != nil && !errdefs.IsNotFound(err) {
			m.log.Error("record stopped sandbox", "sandbox", id, "err", err)
		}
	}()
}

func memTotalMiB() (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int
			_, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
			return kb >> 10, err
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}
