package agent

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper waits for every child of the agent. As PID 1 the agent inherits
// orphans, so it must reap with wait4(-1); the processes it started itself
// get their status delivered through waiters instead of exec.Cmd.Wait, which
// would race with the reaper for the same status.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	sigs    chan os.Signal
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}, sigs: make(chan os.Signal, 1)}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	return r
}

// start runs startFn (which starts a process and returns its pid) under the
// reaper's lock, so the status of a process that exits at once is not reaped
// before its waiter exists.
func (r *reaper) start(startFn func() (int, error)) (<-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := startFn()
	if err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return ch, nil
}

func (r *reaper) run(ctx context.Context) {
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-r.sigs:
		}
	}
}

func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		}
		r.mu.Unlock()
	}
}
