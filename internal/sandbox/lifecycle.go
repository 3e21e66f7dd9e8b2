package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox/pool"
	"github.com/clade-sandbox/clade/internal/steps"
	"github.com/clade-sandbox/clade/internal/store"
)

// CreateRequest asks for a new sandbox. Zero values take the defaults.
type CreateRequest struct {
	Name      string
	Image     string
	MemoryMiB int
	CPUs      float64
	Env       []string
	// Opts are the settings beyond the shape (disk cap, labels, network).
	Opts store.Options
	// FromSnapshot restores the sandbox from a snapshot instead of booting.
	FromSnapshot string
}

// MinMemoryMiB is the smallest memory limit a sandbox can boot with.
const MinMemoryMiB = 64

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// validName checks a sandbox or snapshot name: names and ids share one
// namespace of references, so a name must not look like an id.
func validName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.InvalidArgument, "bad %s name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", kind, name)
	}
	if isID(name) {
		return errdefs.New(errdefs.InvalidArgument, "bad %s name %q: it looks like an id; pick a name that is not %d hex digits", kind, name, IDLength)
	}
	return nil
}

func (m *Manager) validate(req *CreateRequest) error {
	if req.Name != "" {
		if err := validName("sandbox", req.Name); err != nil {
			return err
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
	if err := guest.CheckEnv(req.Env); err != nil {
		return err
	}
	if req.Opts.DiskMiB == 0 {
		req.Opts.DiskMiB = m.cfg.DefaultDiskMiB
	}
	if req.Opts.DiskMiB != 0 && (req.Opts.DiskMiB < MinDiskMiB || req.Opts.DiskMiB > maxDiskMiB) {
		return errdefs.New(errdefs.InvalidArgument, "disk %d MiB is out of range: use %d MiB to %d TiB", req.Opts.DiskMiB, MinDiskMiB, maxDiskMiB>>20)
	}
	if err := validLifetime(&req.Opts); err != nil {
		return err
	}
	if err := validLabels(req.Opts.Labels); err != nil {
		return err
	}
	return m.hooks.completeOptions(&req.Opts)
}

// MinDiskMiB is the smallest disk cap a sandbox can have.
const MinDiskMiB = 16

const maxDiskMiB = 64 << 20 // 64 TiB: a cap, not a reservation

// validLabels checks labels: keys like names, short values, not too many.
func validLabels(labels map[string]string) error {
	if len(labels) > 64 {
		return errdefs.New(errdefs.InvalidArgument, "%d labels: at most 64", len(labels))
	}
	for k, v := range labels {
		if !nameRE.MatchString(k) {
			return errdefs.New(errdefs.InvalidArgument, "bad label key %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", k)
		}
		if len(v) > 255 || strings.ContainsAny(v, "\x00\n") {
			return errdefs.New(errdefs.InvalidArgument, "bad value for label %q: at most 255 bytes, no NUL or newline", k)
		}
	}
	return nil
}

// Create makes a running sandbox and returns its record. A failed create
// leaves nothing behind; a create runs to the end even if ctx ends.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	if req.FromSnapshot != "" {
		return m.createFrom(ctx, req)
	}
	st := steps.New(m.log)
	if err := m.validate(&req); err != nil {
		return store.Sandbox{}, err
	}
	st.Mark("validate")
	resv, err := m.admission.admit(req.MemoryMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer resv.release()
	st.Mark("admit")
	// Held until the record exists: an image removal checks the records.
	m.images.useMu.Lock()
	imageLocked := true
	defer func() {
		if imageLocked {
			m.images.useMu.Unlock()
		}
	}()
	img, err := m.images.Get(ctx, req.Image)
	if err != nil {
		return store.Sandbox{}, err
	}
	// A template's snapshot has no volumes and none of the env or secrets
	// asked for (its processes started without them): those boot.
	if img.Snapshot != "" && len(req.Env) == 0 && len(req.Opts.Volumes) == 0 && len(req.Opts.Secrets) == 0 {
		// A template: restore its ready snapshot (start command already
		// running) when the sandbox asks for the snapshot's resources.
		if sn, err := m.store.GetSnapshot(ctx, img.Snapshot); err == nil && sn.MemoryMiB == req.MemoryMiB && sn.CPUs == req.CPUs &&
			sn.Opts.DiskMiB == req.Opts.DiskMiB && networkMode(sn.Opts) == networkMode(req.Opts) {
			m.images.useMu.Unlock()
			imageLocked = false
			resv.release()
			return m.createFromSnapshot(ctx, sn.ID, req.Name, req.Opts)
		}
	}
	sh := shapeOf(img.Name, req.MemoryMiB, req.CPUs, req.Env, req.Opts)
	st.Mark("image")
	if req.Name != "" {
		// A taken name is refused before a pooled sandbox is touched: a
		// claim renames its hot sandbox before the insert finds the name
		// taken (an insert that loses a race still refuses it).
		if m.store.Taken(req.Name) {
			return store.Sandbox{}, errdefs.New(errdefs.AlreadyExists, "a sandbox named %q already exists: pick another --name or remove it", req.Name)
		}
	}
	// A started sandbox from the hot pool, else a prepared one from the
	// warm pool, else a new one.
	id, hot, isHot := m.pools.takeHot(ctx, req, sh, img.RootFS)
	ok := isHot
	if isHot {
		defer m.pools.hotPool.Want(sh, 0) // refill what was taken
	} else {
		id, ok = m.pools.warm.Take(sh)
		if !ok {
			id = newID()
		}
		defer m.pools.warm.Want(sh, 0) // refill what was taken
	}
	rec := store.Sandbox{ID: id, Name: req.Name, Image: img.Name, State: store.StateCreating,
		MemoryMiB: req.MemoryMiB, CPUs: req.CPUs, Env: req.Env, RootFS: img.RootFS, Opts: freshOptions(req.Opts, time.Now()), CreatedAt: time.Now()}
	unlock := m.locks.lock(rec.ID)
	defer unlock()
	st.Mark("take")
	insert := m.store.InsertSandbox
	var renamed <-chan error
	if isHot {
		// Recorded and no longer the pool's in one write.
		insert = m.store.ClaimPoolSandbox
		renamed = m.pools.renameHot(ctx, specOf(rec, img).Hostname, hot)
		if readyClaim(rec, hot) {
			sb, done, err := m.pools.claimReady(ctx, &rec, img, hot, renamed, st)
			if done {
				if err != nil {
					return store.Sandbox{}, err
				}
				m.track(rec.ID, sb)
				m.log.Info("sandbox created", "sandbox", rec.ID, "name", rec.Name, "image", rec.Image)
				st.Log(m.log, "create timings", "sandbox", rec.ID, "hot", true)
				return rec, nil
			}
			// Its hooks ask for more than it has: the slow way, which
			// starts one cold (the hostname is sent: see claimHot).
		}
	}
	if err := insert(ctx, rec); err != nil {
		switch {
		case isHot && renamed != nil:
			// Renamed already: not the pool's sandbox any more.
			<-renamed
			_ = m.pools.destroyHot(context.WithoutCancel(ctx), id)
		case isHot:
			m.pools.giveBackHot(sh, id, hot) // untouched: back to its pool
		case ok:
			m.pools.warm.Put(ctx, sh, id)
		}
		return store.Sandbox{}, err
	}
	st.Mark("insert")
	resv.recorded()
	m.events.emitRec(rec, events.Event{Type: events.Created})
	m.images.useMu.Unlock()
	imageLocked = false
	// A half-made sandbox would only have to be cleaned up again.
	ctx = context.WithoutCancel(ctx)
	m.crash.hit("create-before-engine")
	var sb engine.Sandbox
	if isHot {
		sb, err = m.pools.claimHot(ctx, rec, img, hot, renamed, st)
	} else {
		sb, err = m.startLocked(ctx, rec, specOf(rec, img), ok, func(spec engine.Spec) (engine.Sandbox, error) {
			sb, err := m.eng.Create(ctx, spec)
			m.crash.hit("create-after-engine")
			return sb, err
		})
	}
	st.Mark("start")
	if err == nil {
		if err = m.moveLocked(ctx, &rec, store.StateRunning, ""); err != nil {
			err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()), m.hooks.afterStop(ctx, rec))
		}
	}
	st.Mark("running")
	if err != nil {
		if derr := errors.Join(m.hooks.afterRemove(ctx, rec), m.deleteRecord(ctx, rec.ID)); derr != nil {
			err = errors.Join(err, derr)
		}
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	m.track(rec.ID, sb)
	st.Mark("track")
	m.log.Info("sandbox created", "sandbox", rec.ID, "name", rec.Name, "image", rec.Image)
	st.Log(m.log, "create timings", "sandbox", rec.ID, "hot", isHot)
	return rec, nil
}

// startLocked runs the hooks around start, which creates or restores the
// engine sandbox of rec from spec (the hooks may add to it). With reconf,
// the guest gets its own setup afterwards: a restored or prepared guest
// boots with the checkpoint's or the preparation's. On error nothing of
// this run is left:
// the engine sandbox is destroyed and the hooks' AfterStop has run.
// Guarded by rec's lock.
func (m *Manager) startLocked(ctx context.Context, rec store.Sandbox, spec engine.Spec, reconf bool, start func(engine.Spec) (engine.Sandbox, error)) (engine.Sandbox, error) {
	m.reaper.awaitReap(rec.Engine())
	t0 := time.Now()
	if err := m.hooks.beforeStart(ctx, rec, &spec); err != nil {
		return nil, m.admission.diskFull(err)
	}
	t1 := time.Now()
	sb, err := start(spec)
	err = m.admission.diskFull(err)
	t2 := time.Now()
	if hs, ok := sb.(engine.HostnameSetter); ok && err == nil && hs.HostnameSet() == spec.Hostname {
		reconf = false // the engine set it as it started the guest
	}
	if err == nil && reconf {
		if err = sb.Guest().Reconfigure(ctx, guest.Config{Hostname: spec.Hostname}); err != nil {
			err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()))
		}
	}
	t3 := time.Now()
	if err == nil {
		if err = m.hooks.afterStart(ctx, rec, sb); err != nil {
			err = errors.Join(err, m.eng.Destroy(ctx, rec.Engine()))
		}
	}
	if err != nil {
		return nil, errors.Join(err, m.hooks.afterStop(ctx, rec))
	}
	m.log.Debug("start", "sandbox", rec.ID, "netns", spec.NetNS != "", "before_hooks", t1.Sub(t0), "engine", t2.Sub(t1), "reconfigure", t3.Sub(t2), "after_hooks", time.Since(t3))
	return sb, nil
}

// createFrom makes one sandbox restored from a snapshot: a fork of one.
func (m *Manager) createFrom(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	if req.Image != "" || req.MemoryMiB != 0 || req.CPUs != 0 || len(req.Env) != 0 || req.Opts.DiskMiB != 0 || req.Opts.Network != nil || len(req.Opts.Volumes) != 0 {
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "a sandbox restored from a snapshot takes the snapshot's image, memory, cpus, env, disk, network and volumes: give only a name")
	}
	if len(req.Opts.Secrets) != 0 {
		// Its memory is the snapshot's: the secrets it has are those the
		// snapshotted sandbox had, and a new one would be dropped unseen.
		return store.Sandbox{}, errdefs.New(errdefs.InvalidArgument, "a sandbox restored from a snapshot has the secrets its snapshot had (they are in its memory) and cannot take others: create it from an image with --secret instead")
	}
	if req.Name != "" {
		if err := validName("sandbox", req.Name); err != nil {
			return store.Sandbox{}, err
		}
	}
	return m.createFromSnapshot(ctx, req.FromSnapshot, req.Name, store.Options{})
}

// createFromSnapshot restores one sandbox from snapshot. The child takes
// the snapshot's options except the network policy and labels of opts,
// when given (a template's sandbox asks for its own).
func (m *Manager) createFromSnapshot(ctx context.Context, snapshot, name string, opts store.Options) (store.Sandbox, error) {
	res, err := m.fork(ctx, snapshot, []store.Sandbox{{Name: name, Opts: opts}})
	if err != nil {
		return store.Sandbox{}, err
	}
	if c := res.Children[0]; c.Err != nil {
		return store.Sandbox{}, c.Err
	}
	// The child is made: a cancelled ctx (its client went away) must not
	// fail the read and so hide it from the caller, which removes what a
	// client gone made (httpapi's clientGone) only when told its id.
	return m.store.GetSandbox(context.WithoutCancel(ctx), res.Children[0].ID)
}

// shapeOf is the warm-pool shape of a sandbox.
func shapeOf(image string, memoryMiB int, cpus float64, env []string, o store.Options) pool.Shape {
	sh := pool.ShapeOf(image, memoryMiB, cpus, env, o.DiskMiB, networkMode(o))
	sh.Engine = o.Engine // a sandbox of one engine never takes another's
	return sh
}

// networkMode is o's network mode, "" when it has none recorded.
func networkMode(o store.Options) string {
	if o.Network == nil {
		return ""
	}
	return o.Network.Mode
}

// specOf is the engine's view of a sandbox of img: the image's environment
// under the sandbox's own, and the image's working directory and user as
// the defaults of every exec.
func specOf(rec store.Sandbox, img image.Image) engine.Spec {
	host := rec.Name
	if host == "" {
		host = "sb-" + rec.ID[:8]
	}
	rootfs := rec.RootFS // the root it was made on, which outlives image replacements
	if rootfs == "" {
		rootfs = img.RootFS
	}
	return engine.Spec{ID: rec.Engine(), Engine: rec.Opts.Engine, RootFS: rootfs, Hostname: host, MemoryMiB: rec.MemoryMiB, CPUs: rec.CPUs, DiskMiB: rec.Opts.DiskMiB,
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

// running returns the engine sandbox of a running sandbox. With wake, a
// sleeping one is woken (one being put to sleep is waited for and then
// woken); without, a sleeping one is a Conflict.
func (m *Manager) running(ctx context.Context, ref string, wake bool) (engine.Sandbox, error) {
	// The hot path: a running sandbox by id needs no database read.
	if sb := m.traffic.use(ref); sb != nil {
		return sb, nil
	}
	rec, unlock, err := m.locks.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	m.traffic.touch(rec.ID)
	defer unlock()
	switch rec.State {
	case store.StateSleeping:
		if !wake {
			return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s, not running (wake it first)", rec.ID, rec.State)
		}
		// The next request wakes a sleeping sandbox.
		if err := m.wakeLocked(ctx, &rec); err != nil {
			return nil, err
		}
	case store.StateStopped:
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s has stopped (%s): remove it with `clade rm %s`", ref, rec.Error, ref)
	case store.StateRunning:
	default:
		return nil, errdefs.New(errdefs.Conflict, "sandbox %s is %s; retry when it is running", ref, rec.State)
	}
	sb := m.traffic.get(rec.ID)
	if sb == nil {
		return nil, errdefs.New(errdefs.Unavailable, "sandbox %s is running but its daemon connection is not back yet; retry", ref)
	}
	return sb, nil
}

// GuestWaking returns the guest connection of a running sandbox, waking a
// sleeping one first (one being put to sleep is waited for), and waiting a
// moment for an agent that is reconnecting (after a snapshot). It returns
// NotFound for an unknown sandbox, Conflict for one that is neither running
// nor sleeping, the wake's error for a failed wake, and Unavailable when the
// agent does not connect.
func (m *Manager) GuestWaking(ctx context.Context, ref string) (*guest.Conn, error) {
	sb, err := m.ready(ctx, ref, true)
	if err != nil {
		return nil, err
	}
	return sb.Guest(), nil
}

// Guest is GuestWaking for a sandbox that runs: a sleeping one (or one
// that a sleep in flight puts to sleep) is a Conflict, never woken.
func (m *Manager) Guest(ctx context.Context, ref string) (*guest.Conn, error) {
	sb, err := m.ready(ctx, ref, false)
	if err != nil {
		return nil, err
	}
	return sb.Guest(), nil
}

// ready is the engine sandbox behind Guest and GuestWaking (wake) and the
// dials (Traffic), its agent ready. A sandbox that a sleep took out of
// service while its agent was reconnecting (its connection retired) is
// looked up again: the sleep is waited for, and the sandbox woken (wake)
// or found asleep.
func (m *Manager) ready(ctx context.Context, ref string, wake bool) (engine.Sandbox, error) {
	for {
		sb, err := m.running(ctx, ref, wake)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = sb.Guest().Ready(rctx)
		cancel()
		if guest.IsRetired(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return sb, nil
	}
}

// RemoveAbandoned removes the sandboxes ids that a create or fork made for
// a client that went away before the answer (Ctrl-C, an SDK's timeout): it
// never learned their ids, and they would run, holding their memory, until
// someone noticed. The removal outlives ctx. It returns the ids removed
// (or gone already); the others are logged.
func (m *Manager) RemoveAbandoned(ctx context.Context, why string, ids ...string) []string {
	ctx = context.WithoutCancel(ctx)
	var removed []string
	for _, id := range ids {
		if err := m.Destroy(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			m.log.Error("removing a sandbox made for a client that went away", "sandbox", id, "call", why, "err", err)
			continue
		}
		removed = append(removed, id)
		m.log.Info("client went away before the answer: sandbox removed", "sandbox", id, "call", why)
	}
	return removed
}

// Destroy removes a sandbox and everything it holds. It waits for an
// operation in flight on the sandbox (a create, sleep, wake or another
// remove) to finish; a sandbox that is gone by then is NotFound.
func (m *Manager) Destroy(ctx context.Context, ref string) error {
	rec, unlock, err := m.locks.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	defer unlock()
	// A removal frees space: on a full disk its writes may use the store's
	// reserve, so that the operator can always remove what filled it.
	ctx = store.ForCleanup(context.WithoutCancel(ctx))
	// Recorded first: a removal the store refuses (a full disk with no
	// reserve left) changes nothing, and the sandbox serves on.
	if err := m.moveLocked(ctx, &rec, store.StateDestroying, ""); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if live := m.traffic.drop(rec.ID); live != nil {
		// Calls in flight (an exec) learn why they end.
		live.Guest().Close(errdefs.New(errdefs.NotFound, "sandbox %s was removed", ref))
	}
	if err := m.destroyLocked(ctx, rec); err != nil {
		if errors.Is(err, errRecordKept) {
			return nil // removed; deleteRecord retries the record's deletion
		}
		return err
	}
	m.gcSnapshot(ctx, rec.Snapshot)
	m.images.gcStaleRoot(ctx, rec.Image, rec.RootFS)
	return nil
}

// destroyLocked destroys rec's engine sandbox and everything the hooks
// hold, then its record. Guarded by rec's lock.
func (m *Manager) destroyLocked(ctx context.Context, rec store.Sandbox) error {
	id := rec.ID
	if rec.State != store.StateDestroying {
		if err := m.moveLocked(ctx, &rec, store.StateDestroying, ""); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	m.crash.hit("destroy-before-engine")
	m.reaper.awaitReap(rec.Engine())
	if err := m.eng.Destroy(ctx, rec.Engine()); err != nil {
		_ = m.store.SetState(ctx, id, store.StateDestroying, err.Error())
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if err := errors.Join(m.hooks.afterStop(ctx, rec), m.hooks.afterRemove(ctx, rec)); err != nil {
		_ = m.store.SetState(ctx, id, store.StateDestroying, err.Error())
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if err := errors.Join(m.cfg.Copies.Drop(sleepCopy(id)), os.RemoveAll(m.cfg.sleepDir(id))); err != nil {
		return err
	}
	m.crash.hit("destroy-after-engine")
	if err := m.deleteRecord(ctx, id); err != nil {
		if errdefs.Is(err, errdefs.ResourceExhausted) {
			m.log.Warn("sandbox removed; the full disk keeps its record (destroying) until there is room", "sandbox", id)
			return fmt.Errorf("%w: %w", errRecordKept, err)
		}
		return err
	}
	m.log.Info("sandbox removed", "sandbox", id)
	return nil
}

// errRecordKept: a sandbox is removed (nothing of it is left), but a full
// disk kept its record, which shows it destroying until deleteRecord's
// retry deletes it. A removal cannot be undone at that point, so it is
// done, not refused.
var errRecordKept = errors.New("the full disk keeps its record until there is room")

// deleteRecord deletes the record of a sandbox whose engine sandbox is
// gone. When a full disk refuses it, the record (creating or destroying)
// is settled in the background once there is room, so that no half-made
// or half-removed sandbox lingers until the next restart.
func (m *Manager) deleteRecord(ctx context.Context, id string) error {
	err := m.store.DeleteSandbox(ctx, id)
	if errdefs.Is(err, errdefs.ResourceExhausted) {
		m.reconciler.settleLater([]string{id})
	}
	if err == nil {
		m.events.emitRemoved(id)
	}
	return err
}

// track makes sb live and marks the sandbox stopped if sb dies by itself
// while it is the sandbox's live engine sandbox.
func (m *Manager) track(id string, sb engine.Sandbox) {
	m.traffic.put(id, sb)
	m.events.observeExecs(id, sb.Guest())
	go func() {
		<-sb.Exited()
		reason := sb.ExitReason()
		if reason == "" {
			return
		}
		unlock := m.locks.lock(id)
		defer unlock()
		if !m.traffic.dropIf(id, sb) {
			return // slept, removed or replaced meanwhile
		}
		// Calls in flight (an exec) learn why they end.
		class := errdefs.Unavailable
		if strings.Contains(reason, "memory") {
			class = errdefs.ResourceExhausted
		}
		sb.Guest().Close(errdefs.New(class, "sandbox %s stopped: %s", id, reason))
		rec, err := m.store.GetSandbox(context.Background(), id)
		if err != nil || rec.State != store.StateRunning {
			return
		}
		m.log.Warn("sandbox stopped", "sandbox", id, "reason", reason)
		if err := m.moveLocked(context.Background(), &rec, store.StateStopped, reason); err != nil && !errdefs.IsNotFound(err) {
			m.log.Error("record stopped sandbox", "sandbox", id, "err", err)
		}
	}()
}

// takeIf takes a prepared sandbox of shape sh from the pool, if use.
func takeIf(use bool, take func(pool.Shape) (string, bool), sh pool.Shape) (string, bool) {
	if !use {
		return "", false
	}
	return take(sh)
}
