package benchkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/clade-sandbox/clade/sdk"
)

// target is one way of doing a phase's work: clade through the SDK, or the
// baseline's plain runsc commands. Phases are written once against it, so
// both sides do the same steps. Every method that makes something records
// it before it can fail half-way, so cleanup finds it.
type target interface {
	side() string
	// create makes a sandbox and returns once it answers an exec of true.
	create(ctx context.Context) (string, error)
	// createHolding is create plus a background process holding mib MiB of
	// touched memory, which survives snapshot and restore.
	createHolding(ctx context.Context, mib int) (string, error)
	exec(ctx context.Context, id string) error
	remove(ctx context.Context, id string) error
	// snapshot checkpoints a running sandbox, leaving it running.
	snapshot(ctx context.Context, id string) (string, error)
	removeSnapshot(ctx context.Context, snap string) error
	// fork restores n sandboxes from snap and returns once every one
	// answers an exec. It returns the ids it made even when it fails.
	fork(ctx context.Context, snap string, n int) ([]string, error)
	// sleep checkpoints a sandbox to disk and stops it; wake restores it in
	// place and returns once it answers an exec.
	sleep(ctx context.Context, id string) error
	wake(ctx context.Context, id string) error
	// cleanup removes every sandbox and snapshot still recorded.
	cleanup(ctx context.Context) error
}

// ledger records what a target made and has not removed yet, by kind
// ("sandbox", "snapshot").
type ledger struct {
	mu sync.Mutex
	m  map[string]map[string]bool
}

func (l *ledger) add(kind, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]map[string]bool{}
	}
	if l.m[kind] == nil {
		l.m[kind] = map[string]bool{}
	}
	l.m[kind][id] = true
}

func (l *ledger) done(kind, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m[kind], id)
}

func (l *ledger) list(kind string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.m[kind]))
	for id := range l.m[kind] {
		out = append(out, id)
	}
	return out
}

// parallel runs f on every item with at most n at a time and joins errors.
func parallel(items []string, n int, f func(string) error) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, max(n, 1))
	)
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(it); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cladeTarget drives the daemon through the SDK.
type cladeTarget struct {
	c         *sdk.Client
	image     string
	memoryMiB int
	// engine is the engine of every sandbox ("" the daemon's default).
	engine string
	// prefix names every sandbox and snapshot this run makes, so the final
	// sweep also finds ones whose create was interrupted before it answered.
	prefix string
	seq    atomic.Int64
	ledger
}

func (t *cladeTarget) side() string { return "clade" }

func (t *cladeTarget) name() string { return fmt.Sprintf("%s-%d", t.prefix, t.seq.Add(1)) }

func (t *cladeTarget) create(ctx context.Context) (string, error) {
	sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: t.memoryMiB, Engine: t.engine})
	if err != nil {
		return "", fmt.Errorf("create: %w", err)
	}
	t.add("sandbox", sb.ID)
	return sb.ID, t.exec(ctx, sb.ID)
}

func (t *cladeTarget) createHolding(ctx context.Context, mib int) (string, error) {
	id, err := t.create(ctx)
	if err != nil {
		return id, err
	}
	st, err := t.c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"python3", "-c", holdScript(mib), "daemon"}})
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d %s", st.Code, st.Error)
	}
	if err != nil {
		return id, fmt.Errorf("start the memory holder in %s: %w", id, err)
	}
	return id, nil
}

func (t *cladeTarget) exec(ctx context.Context, id string) error {
	st, err := t.c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"true"}})
	if err != nil {
		return fmt.Errorf("exec true in %s: %w", id, err)
	}
	if st.Code != 0 {
		return fmt.Errorf("exec true in %s: exit %d %s", id, st.Code, st.Error)
	}
	return nil
}

func (t *cladeTarget) remove(ctx context.Context, id string) error {
	if err := t.c.DeleteSandbox(ctx, id); err != nil && !sdk.IsNotFound(err) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	t.done("sandbox", id)
	return nil
}

func (t *cladeTarget) snapshot(ctx context.Context, id string) (string, error) {
	snap, err := t.c.SnapshotSandbox(ctx, id, t.name())
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", id, err)
	}
	t.add("snapshot", snap.ID)
	return snap.ID, nil
}

func (t *cladeTarget) removeSnapshot(ctx context.Context, snap string) error {
	if err := t.c.DeleteSnapshot(ctx, snap); err != nil && !sdk.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", snap, err)
	}
	t.done("snapshot", snap)
	return nil
}

func (t *cladeTarget) fork(ctx context.Context, snap string, n int) ([]string, error) {
	res, err := t.c.Fork(ctx, snap, n)
	if err != nil {
		return nil, fmt.Errorf("fork %d of %s: %w", n, snap, err)
	}
	var ids []string
	var failed []string
	for _, ch := range res.Children {
		if ch.ID != "" {
			t.add("sandbox", ch.ID)
			ids = append(ids, ch.ID)
		}
		if ch.Error != "" {
			failed = append(failed, fmt.Sprintf("%s (%s)", ch.Error, ch.Code))
		}
	}
	if len(failed) > 0 {
		return ids, fmt.Errorf("fork %d of %s: %d children failed, first: %s", n, snap, len(failed), failed[0])
	}
	if len(ids) != n {
		return ids, fmt.Errorf("fork %d of %s: the daemon answered %d children", n, snap, len(ids))
	}
	return ids, parallel(ids, n, func(id string) error { return t.exec(ctx, id) })
}

func (t *cladeTarget) sleep(ctx context.Context, id string) error {
	if _, err := t.c.Sleep(ctx, id); err != nil {
		return fmt.Errorf("sleep %s: %w", id, err)
	}
	return nil
}

func (t *cladeTarget) wake(ctx context.Context, id string) error {
	if _, err := t.c.Wake(ctx, id); err != nil {
		return fmt.Errorf("wake %s: %w", id, err)
	}
	return t.exec(ctx, id)
}

// cleanup removes sandboxes first: a snapshot that sandboxes were restored
// from cannot be removed before them.
func (t *cladeTarget) cleanup(ctx context.Context) error {
	err := parallel(t.list("sandbox"), 4, func(id string) error { return t.remove(ctx, id) })
	var errs []error
	for _, snap := range t.list("snapshot") {
		// Children of a fork whose answer was lost (interrupted) are
		// known only to the snapshot.
		if s, gerr := t.c.GetSnapshot(ctx, snap); gerr == nil {
			errs = append(errs, parallel(s.UsedBy, 4, func(id string) error { return t.remove(ctx, id) }))
		}
		errs = append(errs, t.removeSnapshot(ctx, snap))
	}
	return errors.Join(append(errs, err)...)
}

// sweep removes whatever carries this run's prefix, for creates and
// snapshots that were interrupted before they answered with an id.
func (t *cladeTarget) sweep(ctx context.Context) error {
	var errs []error
	if sbs, err := t.c.ListSandboxes(ctx); err == nil {
		var ids []string
		for _, sb := range sbs {
			if strings.HasPrefix(sb.Name, t.prefix+"-") {
				ids = append(ids, sb.ID)
			}
		}
		errs = append(errs, parallel(ids, 4, func(id string) error { return t.remove(ctx, id) }))
	} else {
		errs = append(errs, err)
	}
	// Listing snapshots fails on daemons without them; nothing to sweep then.
	if snaps, err := t.c.ListSnapshots(ctx); err == nil {
		for _, s := range snaps {
			if strings.HasPrefix(s.Name, t.prefix+"-") {
				errs = append(errs, parallel(s.UsedBy, 4, func(id string) error { return t.remove(ctx, id) }))
				errs = append(errs, t.removeSnapshot(ctx, s.ID))
			}
		}
	}
	return errors.Join(errs...)
}

// holdScript is a Python program that touches mib MiB and keeps it. With
// the argument "daemon" it detaches into its own session (so the exec that
// started it returns and nothing kills it with the exec's process group)
// and its parent exits only once the memory is touched. Without it, it
// runs in the foreground (as a container's init) and creates
// /tmp/touched when done.
func holdScript(mib int) string {
	return fmt.Sprintf(`import os, sys, time
def hold():
    b = bytearray(%d << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    return b
if sys.argv[1:] == ["daemon"]:
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        sys.exit(0 if os.read(r, 1) else 1)
    os.setsid()
    os.close(r)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    b = hold()
    os.write(w, b"x")
    os.close(w)
else:
    b = hold()
    open("/tmp/touched", "w").close()
while True:
    time.sleep(3600)
`, mib)
}
