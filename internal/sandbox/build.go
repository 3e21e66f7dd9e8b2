package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// CommitRequest turns a sandbox's filesystem into an image.
type CommitRequest struct {
	Name    string
	Env     []string // added to the image's environment
	Workdir string   // the image's working directory; the base image's if empty
	// Start makes the image a template: a sandbox of the new image runs
	// Start in the background until Ready exits 0 (or, without Ready,
	// until something listens on a TCP port), and is snapshotted; creates
	// of the image then restore that snapshot instead of booting.
	Start        string
	Ready        string
	ReadyTimeout time.Duration
	// Volumes are mounted in the template's sandbox (see store.Options).
	Volumes []store.VolumeMount
}

// Builds makes images from sandboxes: a commit of a sandbox's filesystem,
// a template's ready snapshot, and the build sandboxes the fronts' builds
// run in (marked in the store, so a restart removes a killed daemon's).
type Builds struct {
	images *Images
	recs   store.Sandboxes
	marks  store.Images // the build sandboxes' marks, a template's snapshot
	log    *slog.Logger
	// bg lives as long as the service: a removal a full disk refused is
	// retried under it.
	bg   context.Context
	life buildOps
}

// buildOps is what a build needs of the lifecycle.
type buildOps interface {
	Create(ctx context.Context, req CreateRequest) (store.Sandbox, error)
	Destroy(ctx context.Context, ref string) error
	GuestWaking(ctx context.Context, ref string) (*guest.Conn, error)
	Snapshot(ctx context.Context, ref, name string, implicit bool) (store.Snapshot, error)
	removeSnapshot(ctx context.Context, sn store.Snapshot) error
}

// notInImage are the paths of a sandbox that are not its filesystem.
var notInImage = []string{"/proc", "/sys", "/dev", "/.clade"}

// Commit exports a sandbox's whole filesystem as a new image (replacing an
// image of that name; sandboxes on the old one keep it), and with Start also
// its ready snapshot.
func (b *Builds) Commit(ctx context.Context, ref string, req CommitRequest) (image.Image, error) {
	if !image.ValidName(req.Name) {
		return image.Image{}, errdefs.New(errdefs.InvalidArgument, "bad image name %q: use at most 64 lower-case letters, digits, '.', '_' and '-'", req.Name)
	}
	if err := guest.CheckEnv(req.Env); err != nil {
		return image.Image{}, err
	}
	if req.Workdir != "" && !path.IsAbs(req.Workdir) {
		return image.Image{}, errdefs.New(errdefs.InvalidArgument, "workdir %q must be an absolute path", req.Workdir)
	}
	if req.Ready != "" && req.Start == "" {
		return image.Image{}, errdefs.New(errdefs.InvalidArgument, "a ready command needs a start command")
	}
	rec, err := b.recs.GetSandbox(ctx, ref)
	if err != nil {
		return image.Image{}, err
	}
	base, err := b.images.Get(ctx, rec.Image)
	if err != nil {
		return image.Image{}, err
	}
	cfg := base.Config
	cfg.Env = guest.MergeEnv(cfg.Env, rec.Env, req.Env)
	if req.Workdir != "" {
		cfg.WorkingDir = req.Workdir
	}
	// The reader ends with the agent's verdict: a tar the agent could not
	// finish must not pass for a short, complete one.
	tr, err := onBuildGuest(ctx, b.life, rec.ID, func(g *guest.Conn) (io.ReadCloser, error) {
		return g.CopyOut(ctx, "/", notInImage)
	})
	if err != nil {
		return image.Image{}, err
	}
	defer tr.Close()
	img, err := b.images.files.InstallTar(ctx, image.Image{Name: req.Name, Source: fmt.Sprintf("built from %s in sandbox %s", base.Name, rec.ID), Config: cfg}, tr)
	if err == nil {
		img, err = b.images.install(ctx, img)
	}
	if err != nil {
		return image.Image{}, fmt.Errorf("commit %s as image %s: %w", ref, req.Name, err)
	}
	b.log.Info("image built", "image", img.Name, "from", base.Name, "size_mib", img.SizeBytes>>20)
	if req.Start == "" {
		return img, nil
	}
	return b.makeTemplate(ctx, img, req)
}

// makeTemplate starts req.Start in a sandbox of img, waits until it is
// ready, snapshots it and records the snapshot in the image.
func (b *Builds) makeTemplate(ctx context.Context, img image.Image, req CommitRequest) (_ image.Image, err error) {
	sb, err := b.CreateSandbox(ctx, CreateRequest{Image: img.Name, Opts: store.Options{Volumes: req.Volumes}})
	if err != nil {
		return image.Image{}, fmt.Errorf("template %s: %w", img.Name, err)
	}
	defer func() {
		if derr := b.life.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	run := func(cmd string, env ...string) (guest.ExitStatus, string, error) {
		p, err := onBuildGuest(ctx, b.life, sb.ID, func(g *guest.Conn) (*guest.Process, error) {
			return g.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", cmd}, Env: env, Timeout: 30 * time.Second})
		})
		if err != nil {
			return guest.ExitStatus{}, "", err
		}
		defer p.Close()
		out, _ := io.ReadAll(io.MultiReader(p.Stdout, p.Stderr))
		exit, err := p.Wait(ctx)
		return exit, string(out), err
	}
	const startLog = "/tmp/.clade-start.log"
	if exit, out, err := run(`mkdir -p /tmp; nohup sh -c "$CLADE_START" > `+startLog+` 2>&1 & echo $! > /tmp/.clade-start.pid`, "CLADE_START="+req.Start); err != nil || exit.Code != 0 {
		return image.Image{}, errors.Join(err, errdefs.New(errdefs.InvalidArgument, "template %s: start command did not start (%d): %s", img.Name, exit.Code, out))
	}
	timeout := req.ReadyTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ready := req.Ready
	if ready == "" {
		// Something listens: a LISTEN (0A) line in /proc/net/tcp{,6}.
		ready = `cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {found=1} END {exit !found}'`
	}
	deadline := time.Now().Add(timeout)
	for {
		exit, _, err := run(ready)
		if err != nil {
			return image.Image{}, err
		}
		if exit.Code == 0 {
			break
		}
		if alive, _, _ := run(`kill -0 $(cat /tmp/.clade-start.pid)`); alive.Code != 0 {
			_, out, _ := run("tail -c 2000 " + startLog)
			return image.Image{}, errdefs.New(errdefs.InvalidArgument, "template %s: the start command exited before it was ready; its output:\n%s", img.Name, out)
		}
		if time.Now().After(deadline) {
			return image.Image{}, errdefs.New(errdefs.InvalidArgument, "template %s: not ready after %s (ready check: %s)", img.Name, timeout, ready)
		}
		select {
		case <-ctx.Done():
			return image.Image{}, ctx.Err()
		case <-time.After(50 * time.Millisecond): // between readiness probes
		}
	}
	sn, err := b.life.Snapshot(ctx, sb.ID, "", false)
	if err != nil {
		return image.Image{}, fmt.Errorf("template %s: %w", img.Name, err)
	}
	rec, err := b.marks.SetImageSnapshot(ctx, img.Name, sn.ID)
	if err != nil {
		return image.Image{}, errors.Join(err, b.life.removeSnapshot(ctx, sn))
	}
	b.log.Info("template ready", "image", img.Name, "snapshot", sn.ID)
	return fromRecord(rec)
}

// buildCallHook, set by tests only, is called by onBuildGuest between its
// lookup of the sandbox's agent connection and its call on it.
var buildCallHook func(id string)

// onBuildGuest runs op on the agent connection of a build's sandbox id
// (woken first). A build's sandbox can be put to sleep under it: not by
// an idle sleep (a build's sandbox has none), but by the memory pressure
// sleeper, a drain's sleep of idle sandboxes or a sleep asked for, all of
// which retire its connection; a call the retired connection refused
// unstarted (guest.IsRetired) looks the sandbox up again, which waits for
// the sleep and wakes it, and runs op there, as service/local's onGuest
// does for the API's calls. op must not consume anything before its call
// opens (the guest package's calls do not).
func onBuildGuest[T any](ctx context.Context, life buildOps, id string, op func(*guest.Conn) (T, error)) (T, error) {
	for tries := 1; ; tries++ {
		g, err := life.GuestWaking(ctx, id)
		if err != nil {
			var zero T
			return zero, err
		}
		if buildCallHook != nil {
			buildCallHook(id)
		}
		v, err := op(g)
		if !guest.IsRetired(err) || tries == buildRetiredTries {
			return v, err
		}
	}
}

// buildRetiredTries bounds the tries of a build's call refused by a
// sleep each time (each try after the first waits for a sleep and wake).
const buildRetiredTries = 5

// CreateSandbox creates a sandbox for a build (see Manager.Create),
// marked as a build's: the front that serves the build removes it when the
// build's client goes away, and Reap removes it after a restart, since
// no client of a killed daemon's builds is left to finish them.
func (b *Builds) CreateSandbox(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	sb, err := b.life.Create(ctx, req)
	if err != nil {
		return store.Sandbox{}, err
	}
	ctx = context.WithoutCancel(ctx)
	if err := b.marks.AddBuildSandbox(ctx, sb.ID); err != nil {
		return store.Sandbox{}, errors.Join(err, b.life.Destroy(ctx, sb.ID))
	}
	b.log.Info("build sandbox created", "sandbox", sb.ID, "image", sb.Image)
	return sb, nil
}

// End removes a build's sandbox. Ending a build whose sandbox is
// already gone returns nil. When a full disk refuses the removal, it is
// retried in the background until there is room (or the service closes,
// and Reap finishes it at the next start): no build's sandbox is
// left behind for want of a client to retry.
func (b *Builds) End(ctx context.Context, id string) error {
	err := b.end(context.WithoutCancel(ctx), id)
	if errdefs.Is(err, errdefs.ResourceExhausted) {
		go b.retryEnd(id)
	}
	return err
}

func (b *Builds) end(ctx context.Context, id string) error {
	err := b.life.Destroy(ctx, id)
	if errdefs.IsNotFound(err) {
		err = nil
	}
	if err != nil {
		return err
	}
	return b.marks.RemoveBuildSandbox(ctx, id)
}

// retryEnd retries end every few seconds while the disk is full.
func (b *Builds) retryEnd(id string) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-b.bg.Done():
			return
		case <-t.C:
		}
		err := b.end(b.bg, id)
		switch {
		case err == nil:
			b.log.Info("removed a build's sandbox the full disk had kept", "sandbox", id)
			return
		case !errdefs.Is(err, errdefs.ResourceExhausted):
			b.log.Error("remove a build's sandbox", "sandbox", id, "err", err)
			return
		}
	}
}

// Reap removes the sandboxes of builds a killed daemon left: call it
// after Reconcile, before serving.
func (b *Builds) Reap(ctx context.Context) error {
	ids, err := b.marks.BuildSandboxes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		b.log.Info("removing the sandbox of an unfinished build", "sandbox", id)
		errs = append(errs, b.End(ctx, id))
	}
	return errors.Join(errs...)
}
