package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostinfo"
	"github.com/clade-sandbox/clade/internal/store"
	"golang.org/x/sys/unix"
)

// Counters are the service's admission and pressure decisions, for metrics.
type Counters struct {
	AdmissionRefused atomic.Int64 // creates, forks and wakes refused for memory
	DiskRefused      atomic.Int64 // operations refused below the free-disk floor
	PressureSleeps   atomic.Int64 // sandboxes put to sleep under memory pressure
	Wakes            atomic.Int64 // sandboxes woken (by a wake, an exec, a proxied request)
	IdleSleeps       atomic.Int64 // sandboxes put to sleep by their idle sleep
	TimeoutSleeps    atomic.Int64 // sandboxes put to sleep by their timeout
	TimeoutRemovals  atomic.Int64 // sandboxes removed by their timeout
}

// Counters returns the service's decision counters.
func (m *Manager) Counters() *Counters { return &m.counters }

// admission decides whether the host has room for more: the free-memory
// floor, the overcommit cap, the free-disk floor, and the pressure floor's
// headroom for the pools' refills. It owns the memory reserved for
// sandboxes admitted and not yet made.
type admission struct {
	cfg      Config // the floors and the ratio; SnapshotDir is the data dir it watches
	eng      engine.Engine
	recs     store.Sandboxes // the committed memory the cap counts
	counters *Counters
	events   *eventLog
	log      *slog.Logger

	// admitMu orders an admission's read of the committed memory and its
	// reservation against a reservation's recorded: the cap's count of a
	// sandbox moves from one to the other with no moment counted in neither.
	admitMu sync.Mutex

	mu             sync.Mutex
	reservedMiB    int // guarded by mu: admitted, not yet made (the floor's count)
	reservedCapMiB int // guarded by mu: the same, as the overcommit cap counts it
}

// admit reserves memory for sandboxes about to be made (or woken), each
// counted at its whole limit since it may grow to it. It refuses with a
// retryable Unavailable error when
//   - the host would fall below its free-memory floor (MemAvailable less
//     what is reserved and asked for), or
//   - the memory limits of the sandboxes that hold memory, with what is
//     reserved and asked for, would pass the overcommit ratio times the
//     host's memory (the explicit overcommit policy; 0 turns it off).
//
// The caller releases the reservation once the sandboxes exist (their
// memory then shows in MemAvailable and in the records), and tells it
// recorded as soon as their records count toward the cap (a `creating` or
// `waking` record does), so that nothing is counted twice meanwhile.
func (a *admission) admit(mib int) (*reservation, error) {
	return a.admitCounted(mib, mib, "each sandbox counted at its whole memory limit", "")
}

// sharedForkChildMiB is what admission counts a fork child at when its
// engine shares the snapshot's memory with it (engine.ForkSharer) and its
// limit is larger: twice what a qemu child of a 512 MiB guest holding 64
// MiB was measured to take after a command (~31 MiB PSS, ~29 MiB of
// MemAvailable). What it writes later is the overcommit cap's to bound
// (it still counts the child's whole limit), and memory pressure's to
// answer.
const sharedForkChildMiB = 64

// sharesFork reports whether children of a snapshot (dir) or of a running
// sandbox's snapshot (id, dir empty) share its memory (engine.ForkSharer).
func (a *admission) sharesFork(ctx context.Context, id, dir string) bool {
	s, ok := a.eng.(engine.ForkSharer)
	return ok && s.SharesForkMemory(ctx, id, dir)
}

// admitFork admits n children of limit MiB each: counted at their limits,
// or at sharedForkChildMiB against the memory floor when they share their
// snapshot's memory.
func (a *admission) admitFork(n, limit int, shared bool) (*reservation, error) {
	if !shared || limit <= sharedForkChildMiB {
		return a.admit(n * limit)
	}
	return a.admitCounted(n*sharedForkChildMiB, n*limit,
		fmt.Sprintf("each child counted at %d MiB: its engine shares the snapshot's memory with it until it writes", sharedForkChildMiB),
		fmt.Sprintf(" (the %d children count at their whole %d MiB limits here, since each may write all of it)", n, limit))
}

// admitCounted is admit with what the floor check counts (mib, described
// by counted) apart from what the overcommit cap counts (capMiB, with hint
// for its refusal).
func (a *admission) admitCounted(mib, capMiB int, counted, hint string) (*reservation, error) {
	avail, err := memAvailableMiB()
	if err != nil {
		return &reservation{}, nil // no /proc/meminfo: no admission control
	}
	committed := -1
	if a.cfg.MemoryOvercommit > 0 {
		a.admitMu.Lock()
		defer a.admitMu.Unlock()
		if committed, err = a.recs.CommittedMemoryMiB(context.Background()); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if left := avail - a.reservedMiB - mib; left < a.cfg.MemoryFloorMiB {
		a.counters.AdmissionRefused.Add(1)
		a.log.Info("admission refused: memory floor", "need_mib", mib, "available_mib", avail-a.reservedMiB, "floor_mib", a.cfg.MemoryFloorMiB)
		return nil, a.events.refused(errdefs.New(errdefs.Unavailable,
			"not enough memory: this needs %d MiB (%s), %d MiB are available and %d MiB must stay free (daemon flag --memory-floor); remove or sleep sandboxes, or ask for fewer or smaller ones",
			mib, counted, avail-a.reservedMiB, a.cfg.MemoryFloorMiB))
	}
	if committed >= 0 {
		total, _ := memTotalMiB()
		limit := int(a.cfg.MemoryOvercommit * float64(total))
		if committed+a.reservedCapMiB+capMiB > limit {
			a.counters.AdmissionRefused.Add(1)
			a.log.Info("admission refused: overcommit", "need_mib", capMiB, "committed_mib", committed+a.reservedCapMiB, "limit_mib", limit)
			return nil, a.events.refused(errdefs.New(errdefs.Unavailable,
				"memory overcommit limit reached: running sandboxes' limits add up to %d MiB, this needs %d MiB more%s, and the daemon allows %d MiB (%.2g x %d MiB of host memory, flag --memory-overcommit); remove or sleep sandboxes, ask for smaller ones, or raise --memory-overcommit",
				committed+a.reservedCapMiB, capMiB, hint, limit, a.cfg.MemoryOvercommit, total))
		}
	}
	a.reservedMiB += mib
	a.reservedCapMiB += capMiB
	return &reservation{a: a, mib: mib, capMiB: capMiB}, nil
}

// reservation is memory admit set aside for sandboxes not made yet: mib
// against the memory floor, capMiB against the overcommit cap. Its
// methods are idempotent and safe to call in any order.
type reservation struct {
	a           *admission // nil: nothing reserved
	mib, capMiB int        // guarded by a.mu
}

// recorded gives back the cap's part: the sandboxes' records now count
// their limits toward it (CommittedMemoryMiB). The floor's part stays
// until release, since MemAvailable shows the memory only once they run.
// Call it only after the records are written.
func (r *reservation) recorded() {
	if r.a == nil {
		return
	}
	r.a.admitMu.Lock()
	defer r.a.admitMu.Unlock()
	r.a.mu.Lock()
	r.a.reservedCapMiB -= r.capMiB
	r.capMiB = 0
	r.a.mu.Unlock()
}

// release gives back what is left of the reservation.
func (r *reservation) release() {
	if r.a == nil {
		return
	}
	r.a.mu.Lock()
	r.a.reservedMiB -= r.mib
	r.a.reservedCapMiB -= r.capMiB
	r.mib, r.capMiB = 0, 0
	r.a.mu.Unlock()
}

// checkDisk refuses an operation that writes state to disk (create, fork,
// snapshot, sleep, pull) when the data dir's file system is below its
// free-disk floor: better a clear, retryable refusal than a failure half way.
func (a *admission) checkDisk(op string) error {
	if a.cfg.DiskFloorMiB <= 0 || a.cfg.SnapshotDir == "" {
		return nil
	}
	free, err := freeDiskMiB(a.cfg.SnapshotDir)
	if err != nil {
		return nil
	}
	if free < a.cfg.DiskFloorMiB {
		a.counters.DiskRefused.Add(1)
		return a.events.refused(errdefs.New(errdefs.Unavailable, "%s refused: the data dir's file system has %d MiB free and %d MiB must stay free (daemon flag --disk-floor); remove snapshots, sleeping sandboxes or images, then retry", op, free, a.cfg.DiskFloorMiB))
	}
	return nil
}

// diskFull says that err, an engine's failure, happened on a data dir
// whose file system is (nearly) full, as ResourceExhausted: runsc's own
// errors ("exit status 128") do not say so.
func (a *admission) diskFull(err error) error {
	if err == nil || errdefs.ClassOf(err) == errdefs.ResourceExhausted || a.cfg.SnapshotDir == "" {
		return err
	}
	if free, serr := freeDiskMiB(a.cfg.SnapshotDir); serr == nil && free < fullDiskMiB {
		return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("the data dir's file system is full (%d MiB free): free some space and retry: %w", free, err))
	}
	return err
}

// fullDiskMiB is the free space below which an engine failure is taken
// for a full disk.
const fullDiskMiB = 64

// CheckDisk is checkDisk for operations outside the service (image pulls).
func (m *Manager) CheckDisk(op string) error { return m.admission.checkDisk(op) }

func freeDiskMiB(path string) (int, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int(st.Bavail * uint64(st.Bsize) >> 20), nil
}

func memTotalMiB() (int, error) {
	n, err := hostinfo.MemTotalMiB()
	return int(n), err
}

func memAvailableMiB() (int, error) {
	n, err := hostinfo.MemAvailableMiB()
	return int(n), err
}
