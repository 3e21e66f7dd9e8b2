package sandbox

import (
	"context"
	"fmt"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// SleepIdle puts running sandbox id to sleep for a drain of its node when
// it is idle, so that the cluster can give it to another node as it gives
// a sleeping one. Idle is what the sleepers already decide (the pressure
// sleeper's test): no exec, attach or file call in flight, no proxied
// connection or request open (ingress, port streams, the code
// interpreter), and none of them for the last idleAfter. A background
// process of its own does not make it busy: the sleep checkpoints it and
// it runs on after the wake.
//
// It answers busy, why it stays for now ("" when it slept); a Conflict
// when it can never move this way (no --object-store on this node,
// volumes, secrets, an engine without snapshots); NotFound for a sandbox
// this node does not have. A sandbox that is not running is left alone.
func (mv *Mover) SleepIdle(ctx context.Context, id string) (busy string, err error) {
	m := mv.m
	if m.cfg.Copies == nil {
		return "", errdefs.New(errdefs.Conflict, "this node has no --object-store: its running sandboxes cannot move (they stay until removed)")
	}
	snapper, err := snapshotterOf(m.eng)
	if err != nil {
		return "", errdefs.New(errdefs.Conflict, "this node's engine cannot put sandboxes to sleep: its running sandboxes cannot move")
	}
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	if rec.State != store.StateRunning {
		return fmt.Sprintf("it is %s", rec.State), nil
	}
	if err := movable(rec); err != nil {
		return "", err
	}
	if why := m.traffic.busyWhy(id, idleAfter); why != "" {
		return why, nil
	}
	if err := m.admission.checkDisk("sleep"); err != nil {
		return err.Error(), nil
	}
	busy, err = m.sleepLocked(context.WithoutCancel(ctx), snapper, &rec, idleAfter)
	if busy != "" || err != nil {
		return busy, err
	}
	m.log.Info("drain: idle sandbox put to sleep to move it to another node", "sandbox", id)
	return "", nil
}
