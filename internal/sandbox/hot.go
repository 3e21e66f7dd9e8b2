package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox/pool"
	"github.com/clade-sandbox/clade/internal/steps"
	"github.com/clade-sandbox/clade/internal/store"
)

// The hot pool keeps sandboxes already started, their agent connected, for
// plain creates: a claim only records the sandbox and gives it its identity
// (hostname, egress policy), with no process start on the create's path.
// The default shape is kept always; any other shape a plain create missed
// twice within the pool's expiry (a client that always asks for --memory
// 256, or for --network none on a daemon whose default is internet) gets
// one, until nobody asked for it for that long. Without that, such creates
// start a prepared sandbox: runsc start, ~100 ms, of which a network of
// its own adds ~10-20 ms (docs/benchmarks.md, netcreate). It is small
// (Config.HotPool for the default shape, as many again for learned ones)
// since every hot sandbox holds its idle memory (~15 MiB), is refilled one
// at a time in the background, and is given back first when memory runs
// short. The prepared pool (created, not started) stays for forks, wakes
// and creates the hot pool has nothing for.

// hotPinned is how many hot sandboxes the pool keeps however long nobody
// asks for them: the default image's and those of HotImages.
func (c Config) hotPinned() int {
	n := c.HotPool
	for _, k := range c.HotImages {
		n += k
	}
	return n
}

// hotRefillDefer is how long the hot pool waits after a claim before it
// starts the sandbox that replaces the claimed one: under load, a refill's
// runsc processes starting beside the claim doubled its answer time.
const hotRefillDefer = 50 * time.Millisecond

// hotSandbox is a started sandbox in the hot pool and the image root it
// runs on: a claim must not hand out a root its image no longer names.
type hotSandbox struct {
	sb   engine.Sandbox
	root string
	// network is the network options it was started with (its egress
	// policy): a claim asking for the same has nothing to apply.
	network *store.NetworkOptions
	// spec is what it was started with, the hooks' additions included:
	// a claim whose hooks ask for more (mounts: volumes, the tmpfs of
	// secret files) starts cold. Secret environment is no such thing: the
	// secret hook hands it to the agent after the start (AfterStart).
	spec engine.Spec
}

// startHot starts one sandbox of shape sh for the hot pool. Its record-less
// id is the engine's; a claim makes it the sandbox's.
func (p *Pools) startHot(ctx context.Context, sh pool.Shape) (string, error) {
	// Near the pressure floor the pool stays empty: WatchPressure would
	// give back what the refill starts at its next tick (a start and a
	// destroy every tick, and no idle sandbox ever put to sleep, since a
	// flush that gave back something ends the tick).
	if err := p.admission.nearPressure("hot pool", 64*max(1, p.cfg.hotPinned())); err != nil {
		return "", err
	}
	// A hot sandbox holds its idle memory: never at the cost of the floor.
	resv, err := p.admission.admit(64)
	if err != nil {
		return "", err
	}
	defer resv.release()
	img, err := p.images.Get(ctx, sh.Image)
	if err != nil {
		return "", err
	}
	rec := store.Sandbox{ID: newID(), MemoryMiB: sh.MemoryMiB, CPUs: sh.CPUs, Env: sh.EnvList(), Opts: store.Options{DiskMiB: sh.DiskMiB, Engine: sh.Engine}}
	if sh.Network != "" {
		// Until a claim only the agent runs in it: it starts with the
		// policy a plain create gets, so the common claim has no rules to
		// apply; a claim asking for another policy has its hooks apply it.
		nw, err := p.hooks.poolNetwork(sh)
		if err != nil {
			return "", err
		}
		rec.Opts.Network = nw
	}
	// Marked first: a restart destroys a marked sandbox nobody claimed.
	if err := p.marks.AddPoolSandbox(ctx, rec.ID); err != nil {
		return "", err
	}
	var started engine.Spec
	sb, err := p.life.startLocked(ctx, rec, specOf(rec, img), false, func(spec engine.Spec) (engine.Sandbox, error) {
		started = spec
		return p.eng.Create(ctx, spec)
	})
	if err != nil {
		// Unmarked only once the engine is known to have let go of it: a
		// started sandbox whose destroy failed keeps its mark, so that the
		// next restart destroys it instead of keeping it as unrecorded.
		ctx := context.WithoutCancel(ctx)
		if derr := p.eng.Destroy(ctx, rec.ID); derr != nil {
			return "", errors.Join(err, derr)
		}
		return "", errors.Join(err, p.marks.RemovePoolSandbox(ctx, rec.ID))
	}
	if err := p.warmHot(ctx, sh.Image, sb); err != nil {
		// Never handed out half warm: destroyed, and the pool backs off
		// this shape as for any failed start.
		return "", errors.Join(err, p.destroyHot(context.WithoutCancel(ctx), rec.ID))
	}
	p.mu.Lock()
	p.hot[rec.ID] = hotSandbox{sb: sb, root: img.RootFS, spec: started, network: rec.Opts.Network}
	p.mu.Unlock()
	return rec.ID, nil
}

// warmTimeout bounds an image's warm step in a hot sandbox.
const warmTimeout = 2 * time.Minute

// warmHot runs the warm step of image (image.WarmCommand) in the hot
// sandbox sb, if it has one, and fails unless it exits 0.
func (p *Pools) warmHot(ctx context.Context, imageName string, sb engine.Sandbox) error {
	cmd := image.WarmCommand(imageName)
	if cmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, warmTimeout+10*time.Second)
	defer cancel()
	start := time.Now()
	stdin := image.WarmStdin(imageName)
	proc, err := sb.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, Timeout: warmTimeout, Stdin: stdin != nil})
	if err != nil {
		return fmt.Errorf("hot pool: warm step of the %s image: %w", imageName, err)
	}
	defer proc.Close()
	if stdin != nil {
		go func() {
			// The step may not read it all (it exits early): a failed
			// write is its exit's to explain.
			_, _ = proc.Stdin.Write(stdin)
			_ = proc.Stdin.Close()
		}()
	}
	var out tailBuffer
	done := make(chan struct{})
	go func() { _, _ = io.Copy(&out, proc.Stderr); close(done) }()
	_, _ = io.Copy(&out, proc.Stdout)
	<-done
	exit, err := proc.Wait(ctx)
	if err != nil {
		return fmt.Errorf("hot pool: warm step of the %s image: %w", imageName, err)
	}
	if exit.Code != 0 {
		return fmt.Errorf("hot pool: warm step of the %s image exited %d: %s", imageName, exit.Code, strings.TrimSpace(out.String()))
	}
	p.log.Debug("hot pool: warmed a sandbox", "image", imageName, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// tailBuffer keeps the last 2 KiB written to it (what a failed warm step
// said last).
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = append(t.b[:0], t.b[len(t.b)-2048:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.ToValidUTF8(string(t.b), "?") }

// destroyHot removes a hot sandbox nobody claimed.
func (p *Pools) destroyHot(ctx context.Context, id string) error {
	p.mu.Lock()
	delete(p.hot, id)
	p.mu.Unlock()
	if err := errors.Join(p.eng.Destroy(ctx, id), p.hooks.afterStop(ctx, store.Sandbox{ID: id})); err != nil {
		return err // still marked: the next restart tries again
	}
	return p.marks.RemovePoolSandbox(ctx, id)
}

// reapPool destroys the pools' sandboxes a killed daemon left unclaimed
// (marked, no record) and unmarks claimed ones; it returns the ids it
// handled, which the engine listing must not count as unrecorded.
func (p *Pools) reapPool(ctx context.Context, recorded map[string]bool) (map[string]bool, error) {
	ids, err := p.marks.PoolSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	done := map[string]bool{}
	var errs []error
	for _, id := range ids {
		done[id] = true
		if recorded[id] {
			errs = append(errs, p.marks.RemovePoolSandbox(ctx, id))
			continue
		}
		p.log.Info("reconcile: destroying an unclaimed hot-pool sandbox", "engine_sandbox", id)
		errs = append(errs, p.destroyHot(ctx, id))
	}
	return done, errors.Join(errs...)
}

// takeHot returns a live hot sandbox of shape sh running on root for req,
// or false. A create whose hooks add mounts (volumes, the tmpfs of secret
// files) is never served hot (a claim would replace the hot sandbox with
// one started cold, slower than a prepared one), and its misses teach the
// pool nothing.
func (p *Pools) takeHot(ctx context.Context, req CreateRequest, sh pool.Shape, root string) (string, hotSandbox, bool) {
	if !hotServes(req) || (hasEnvSecrets(req) && image.WarmCommand(req.Image) != "") {
		// A warmed sandbox's processes (the code interpreter's kernels)
		// started before the claim handed the agent its secret
		// environment, and would not see it: such a create starts cold.
		return "", hotSandbox{}, false
	}
	for {
		id, ok := p.hotPool.Take(sh)
		if !ok {
			return "", hotSandbox{}, false
		}
		p.mu.Lock()
		h, ok := p.hot[id]
		delete(p.hot, id)
		p.mu.Unlock()
		if ok && h.root == root {
			select {
			case <-h.sb.Exited():
			default:
				return id, h, true
			}
		}
		// Died while it waited, or started on a root its image no longer
		// names (the image was replaced): next.
		_ = p.destroyHot(context.WithoutCancel(ctx), id)
	}
}

// hotServes reports whether a hot sandbox can serve req: one that asks
// for no mounts (see sameStart).
func hotServes(req CreateRequest) bool {
	if len(req.Opts.Volumes) > 0 {
		return false
	}
	for _, s := range req.Opts.Secrets {
		if s.File != "" {
			return false
		}
	}
	return true
}

// hasEnvSecrets reports whether req gives the sandbox secrets as
// environment variables.
func hasEnvSecrets(req CreateRequest) bool {
	for _, s := range req.Opts.Secrets {
		if s.File == "" {
			return true
		}
	}
	return false
}

// giveBackHot returns an unclaimed hot sandbox to the pool: a create that
// failed before its claim (a taken name, a request gone) must not cost
// the pool a sandbox start.
func (p *Pools) giveBackHot(sh pool.Shape, id string, h hotSandbox) {
	p.mu.Lock()
	p.hot[id] = h
	p.mu.Unlock()
	p.hotPool.Put(context.Background(), sh, id)
}

// claimHot makes the hot sandbox h the running sandbox rec (recorded,
// creating, its lock held): the hooks apply rec's options to it (its
// egress policy), and its guest gets rec's hostname. When the hooks fill
// in a spec the hot sandbox was not started with (a volume, the tmpfs of
// secret files), it is replaced by a sandbox started cold for rec. On
// error nothing of it is left.
func (p *Pools) claimHot(ctx context.Context, rec store.Sandbox, img image.Image, h hotSandbox, renamed <-chan error, st *steps.Steps) (engine.Sandbox, error) {
	spec := specOf(rec, img)
	// The hooks see a start (that is how they apply options to a slot the
	// sandbox already has).
	if err := p.hooks.beforeStart(ctx, rec, &spec); err != nil {
		if renamed != nil {
			<-renamed
		}
		return nil, errors.Join(err, p.eng.Destroy(ctx, rec.Engine()))
	}
	st.Mark("hooks")
	if renamed != nil {
		// The hostname was sent before the record was written, and the
		// claim does not wait for its answer (a sandbox idle in the pool
		// takes 1-2 ms to wake for it): the agent applies it on its read
		// loop before any frame sent after it, so every later exec, copy
		// or port connection through the agent sees it. It cannot fail
		// for a valid name; if the agent's connection breaks first, the
		// sandbox is unusable either way, and the answer says so in the log.
		select {
		case err := <-renamed: // answered already, or never sent
			if err != nil {
				err = fmt.Errorf("claim a hot sandbox: set its hostname: %w", err)
				return nil, errors.Join(err, p.eng.Destroy(ctx, rec.Engine()), p.hooks.afterStop(ctx, rec))
			}
		default:
			go func() {
				if err := <-renamed; err != nil {
					p.log.Error("hot pool: the claimed sandbox did not take its hostname", "sandbox", rec.ID, "hostname", spec.Hostname, "err", err)
				}
			}()
		}
	}
	if want, have := spec, h.spec; !sameStart(want, have) {
		p.log.Info("hot pool: the sandbox's hooks ask for more than a hot sandbox has; starting it cold", "sandbox", rec.ID)
		if err := p.eng.Destroy(ctx, rec.Engine()); err != nil {
			return nil, errors.Join(err, p.hooks.afterStop(ctx, rec))
		}
		return p.life.startLocked(ctx, rec, specOf(rec, img), false, func(spec engine.Spec) (engine.Sandbox, error) {
			return p.eng.Create(ctx, spec)
		})
	}
	if err := p.hooks.afterStart(ctx, rec, h.sb); err != nil {
		return nil, errors.Join(fmt.Errorf("claim a hot sandbox: %w", err), p.eng.Destroy(ctx, rec.Engine()), p.hooks.afterStop(ctx, rec))
	}
	return h.sb, nil
}

// readyClaim reports whether rec can claim h in one store write, its
// hooks run while h is still the pool's (claimReady): nothing of the
// claim needs the record first. Volumes do (a volume removal checks the
// records for users before it unmounts) and start cold anyway; another
// network policy is an nftables batch (milliseconds), which the slow path
// applies without holding the image lock.
func readyClaim(rec store.Sandbox, h hotSandbox) bool {
	return len(rec.Opts.Volumes) == 0 && reflect.DeepEqual(rec.Opts.Network, h.network)
}

// claimReady makes the hot sandbox h the running sandbox rec (creating,
// unrecorded, its lock held) with one store write: rec's hooks run (its
// secrets handed to the agent) while h is still marked the pool's, then
// one transaction records rec running and drops the mark. A daemon killed
// before that commit leaves a marked sandbox without a record, which the
// restart destroys; after it, a running sandbox with all of rec applied,
// which it reattaches. It returns false, with h untouched but for its
// hostname, when the hooks ask for more than h was started with (the
// tmpfs of secret files): the caller claims it the slow way. On error
// nothing of h is left.
func (p *Pools) claimReady(ctx context.Context, rec *store.Sandbox, img image.Image, h hotSandbox, renamed <-chan error, st *steps.Steps) (engine.Sandbox, bool, error) {
	ctx = context.WithoutCancel(ctx)
	fail := func(err error) (engine.Sandbox, bool, error) {
		if renamed != nil {
			<-renamed
		}
		return nil, true, errors.Join(err, p.destroyHot(ctx, rec.ID), p.hooks.afterRemove(ctx, *rec))
	}
	p.crash.hit("create-before-engine")
	spec := specOf(*rec, img)
	if err := p.hooks.beforeStart(ctx, *rec, &spec); err != nil {
		return fail(err)
	}
	if !sameStart(spec, h.spec) {
		return nil, false, nil
	}
	st.Mark("hooks")
	if err := p.hooks.afterStart(ctx, *rec, h.sb); err != nil {
		return fail(fmt.Errorf("claim a hot sandbox: %w", err))
	}
	if renamed != nil {
		select {
		case err := <-renamed: // answered already, or never sent
			renamed = nil
			if err != nil {
				return fail(fmt.Errorf("claim a hot sandbox: set its hostname: %w", err))
			}
		default:
			// See claimHot: applied before any later frame.
			done := renamed
			renamed = nil
			go func() {
				if err := <-done; err != nil {
					p.log.Error("hot pool: the claimed sandbox did not take its hostname", "sandbox", rec.ID, "hostname", spec.Hostname, "err", err)
				}
			}()
		}
	}
	p.crash.hit("create-after-engine")
	claimed := *rec
	claimed.State = store.StateRunning
	if err := p.marks.ClaimPoolSandbox(ctx, claimed); err != nil {
		return fail(err)
	}
	st.Mark("insert")
	p.events.emitRec(*rec, events.Event{Type: events.Created})
	p.events.emitMove(claimed, store.StateCreating, store.StateRunning, "")
	*rec = claimed
	return h.sb, true, nil
}

// renameHot sends the hot sandbox h its hostname and returns a channel
// for the agent's answer, or nil when h has that name already (a claim
// without a name keeps the one made from the id). A claim sends it
// before it writes its record and does not wait for the answer (see
// claimHot).
func (p *Pools) renameHot(ctx context.Context, hostname string, h hotSandbox) <-chan error {
	if hostname == h.spec.Hostname {
		return nil
	}
	done := make(chan error, 1)
	ctx = context.WithoutCancel(ctx)
	// Sent here, before the create can answer: a request the client
	// sends after the answer is on the connection after it.
	wait, err := h.sb.Guest().SendReconfigure(ctx, guest.Config{Hostname: hostname})
	if err != nil {
		done <- err
		return done
	}
	go func() { done <- wait(ctx) }()
	return done
}

// sameStart reports whether a sandbox started with have serves one that
// would start with want: all but the hostname (a claim reconfigures it).
func sameStart(want, have engine.Spec) bool {
	want.Hostname, have.Hostname = "", ""
	return reflect.DeepEqual(want, have)
}

// flushHot gives back every hot sandbox (memory is short); the pool
// refills once the memory floor admits it again.
func (p *Pools) flushHot(ctx context.Context) int {
	return p.hotPool.Flush(ctx)
}
