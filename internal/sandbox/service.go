// Package sandbox is clade's lifecycle service: it validates requests, moves
// sandboxes through the states of a transition table (state.go), records
// every transition in the store before and after the engine call, holds one
// lock per sandbox for every mutation (locks.go), calls the hooks that attach
// features at fixed points (hooks.go), and after a restart reconciles what
// the store says with what the engine has (reconcile.go).
//
// The Manager keeps the lifecycle's own (lifecycle.go: create, remove, the
// guest of a running sandbox; snapshot.go, fork.go, sleep.go) and composes
// parts that own the rest, each with its own state: admission, Lifetimes,
// Traffic, the reaper, the reconciler, Pools (the warm and hot pools; their
// bookkeeping is package pool), Images and Builds, the eventLog and the
// hookChain. See Manager and docs/architecture.md.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/store"
)

// Config holds the service's limits and defaults.
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
	// Copies, when set, copies sleep images and explicit snapshots into
	// a snapshot store once sealed, and fetches one back when its local
	// dir is gone (package snapstore). Nil: local dirs only.
	Copies *snapstore.Copies
	// DefaultDiskMiB caps what sandboxes that ask for no cap may write (0:
	// no cap).
	DefaultDiskMiB int
	// MaxFork caps the children of one fork.
	MaxFork int
	// MemoryFloorMiB is the free memory (MemAvailable) that creates, forks
	// and wakes must leave on the host.
	MemoryFloorMiB int
	// WarmPool caps the prepared sandboxes kept per shape (0: none);
	// WarmCreate is how many are kept for plain creates of the defaults.
	WarmPool   int
	WarmCreate int
	// HotPool is how many sandboxes of the default shape are kept started,
	// their agent connected, for plain creates (0: none); shapes learned
	// from demand get one each, HotPool of them at most. See hot.go.
	HotPool int
	// HotImages keeps started sandboxes of the default shape on other
	// images as well, by image name: how many of each (E2B's base
	// template, for one). They are pinned like the default image's; one
	// whose image is missing or being built is retried until it is there.
	HotImages map[string]int
	// RestoreParallel bounds the restores of one fork that run at once,
	// and the wakes that run at once; twice the core count when zero. Restores are mostly CPU, but each also
	// waits on process starts and the agent: on 2 cores, 4 at once forked 16
	// children ~15% faster than 2 (1.18 vs 1.39 s p50, interleaved runs).
	RestoreParallel int
	// MemoryOvercommit caps the sum of the memory limits of the sandboxes
	// that hold memory at this ratio of the host's memory (0: no cap).
	MemoryOvercommit float64
	// PressureFloorMiB: when MemAvailable falls below it, the service puts
	// the least recently used idle sandboxes to sleep until it recovers,
	// before the kernel's OOM killer would pick a victim (0: half the
	// memory floor; negative: off).
	PressureFloorMiB int
	// DiskFloorMiB is the free space the data dir's file system must keep:
	// below it, creates, forks, snapshots, sleeps and pulls are refused.
	DiskFloorMiB int
	// DestroyUnrecorded makes Reconcile destroy started engine sandboxes the
	// store does not know. Off by default: a lost or replaced database must
	// not take every running sandbox with it.
	DestroyUnrecorded bool
	// Hooks attach features to the lifecycle, called in order.
	Hooks []Hook
	// EventRing is how many recent events are kept for clients that resume
	// a stream (0: events.DefaultRing).
	EventRing int
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

// Manager is the lifecycle service: it owns sandboxes and snapshots, their
// records' states (moveLocked) and the per-id locks, and composes the
// parts that own the rest, each with its own state and lock:
//
//	admission   memory floor, overcommit cap, disk floor; the reservations (admission.go)
//	Lifetimes   timeouts, idle sleeps, memory pressure sleeps (lifetimes.go, pressure.go)
//	Traffic     the live engine sandboxes, their use and holds; dials (traffic.go)
//	reaper      a sleep's background teardown (reap.go)
//	reconciler  the restart census and the retries of what could not settle (reconcile.go)
//	Pools       the warm and hot pools (warm.go, hot.go; bookkeeping in package pool)
//	Images      images and their roots (images.go); Builds: commits, templates (build.go)
//	eventLog    the lifecycle event bus (events.go); hookChain: the hooks (hooks.go)
type Manager struct {
	cfg   Config
	eng   engine.Engine
	store store.All
	log   *slog.Logger
	// locks holds one lock per sandbox and snapshot id; see locks.go for
	// the lock model.
	locks *recordLocks
	hooks hookChain
	crash crashPoints
	// wakes holds a token per wake restoring now (RestoreParallel).
	wakes chan struct{}

	counters   Counters
	events     *eventLog
	admission  *admission
	traffic    *Traffic
	lifetimes  *Lifetimes
	reaper     *reaper
	reconciler *reconciler
	pools      *Pools
	images     *Images
	builds     *Builds
	// pins keep snapshots a fork across nodes sends or restores from
	// collection (forkimport.go).
	pins pins

	// bg lives as long as the service (Close ends it): work that must
	// outlive the request that started it, e.g. removing a build's
	// sandbox once a full disk has room again, runs under it.
	bg     context.Context
	stopBg context.CancelFunc
}

// New returns a service. Call Reconcile before serving.
func New(cfg Config, eng engine.Engine, st store.All, images *image.Store) *Manager {
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
	if cfg.PressureFloorMiB == 0 {
		cfg.PressureFloorMiB = cfg.MemoryFloorMiB / 2
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, eng: eng, store: st, log: cfg.Log, hooks: hookChain(cfg.Hooks),
		locks: &recordLocks{recs: st, snaps: st}, crash: crashPoints{at: cfg.CrashAt, log: cfg.Log},
		wakes: make(chan struct{}, cfg.RestoreParallel)}
	m.bg, m.stopBg = context.WithCancel(context.Background())
	m.events = newEventLog(cfg.EventRing, st)
	m.admission = &admission{cfg: cfg, eng: eng, recs: st, counters: &m.counters, events: m.events, log: cfg.Log}
	m.images = newImages(images, st, st, cfg.Log, m)
	m.images.crash = m.crash
	if cfg.SnapshotDir != "" {
		// Beside the snapshots, in the daemon's state: each node's own.
		m.images.shipDir = filepath.Join(filepath.Dir(cfg.SnapshotDir), "shipped-roots")
	}
	m.pools = newPools(&Pools{cfg: cfg, eng: eng, marks: st, recs: st, images: m.images, admission: m.admission,
		hooks: m.hooks, events: m.events, crash: m.crash, log: cfg.Log, life: m, wakes: m.wakes})
	m.images.pools = m.pools
	m.reaper = &reaper{eng: eng, hooks: m.hooks, log: cfg.Log, reaping: map[string]chan struct{}{}}
	m.traffic = newTraffic(m.hooks, m)
	m.lifetimes = &Lifetimes{cfg: cfg, eng: eng, recs: st, locks: m.locks, traffic: m.traffic, images: m.images,
		admission: m.admission, counters: &m.counters, log: cfg.Log, life: m, flushPools: m.pools.flush}
	m.reconciler = &reconciler{cfg: cfg, eng: eng, store: st, locks: m.locks, hooks: m.hooks, traffic: m.traffic,
		images: m.images, pools: m.pools, log: cfg.Log, bg: m.bg, life: m, settling: map[string]bool{}}
	m.builds = &Builds{images: m.images, recs: st, marks: st, log: cfg.Log, bg: m.bg, life: m}
	return m
}

// Images returns the image service: list, inspect, pull, import, remove.
func (m *Manager) Images() *Images { return m.images }

// Builds returns the image builds: commits, templates, build sandboxes.
func (m *Manager) Builds() *Builds { return m.builds }

// Pools returns the warm and hot pools: start them, and their figures.
func (m *Manager) Pools() *Pools { return m.pools }

// Traffic returns the running sandboxes' traffic: holds, and dials to
// their ports.
func (m *Manager) Traffic() *Traffic { return m.traffic }

// Lifetimes returns the lifetime policy: timeouts, idle sleeps, memory
// pressure sleeps.
func (m *Manager) Lifetimes() *Lifetimes { return m.lifetimes }

// Engine returns the service's engine.
func (m *Manager) Engine() engine.Engine { return m.eng }

// Close drops the guest connections; sandboxes keep running for the next
// daemon to reattach.
func (m *Manager) Close() {
	m.DrainPools()
	_ = m.eng.Close()
}

// DrainPools stops background work and destroys the pools' sandboxes
// (prepared and hot), so that the engine is left with the recorded
// sandboxes only. Close calls it; calling it again is harmless.
func (m *Manager) DrainPools() {
	m.stopBg()
	m.reaper.wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.pools.drain(ctx)
}

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

// crashPoints kill the process at the point Config.CrashAt names, for
// tests of restart safety.
type crashPoints struct {
	at  string
	log *slog.Logger
}

// hit kills the process at the named point when configured to.
func (c crashPoints) hit(name string) {
	if c.at == name {
		c.log.Warn("crashing on purpose", "point", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
