package agent

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// killAll kills every process of the sandbox but the agent until none is
// left alive (zombies are the reaper's): kill(-1) from PID 1 reaches every
// other process, one that forks between two rounds is caught by the next.
// It runs no program, so it works in a sandbox without a shell. A sandbox
// whose processes still outrun it after a minute is an error.
func killAll(ctx context.Context) wire.ExitMsg {
	if os.Getpid() != 1 {
		return errExit(errdefs.New(errdefs.Conflict, "kill-all: the agent is not PID 1 (pid %d)", os.Getpid()))
	}
	deadline := time.Now().Add(time.Minute)
	for round := 0; ; round++ {
		_ = unix.Kill(-1, unix.SIGKILL)
		left, err := liveProcesses()
		if err != nil {
			return errExit(errdefs.Wrap(errdefs.Internal, err))
		}
		if left == 0 {
			return wire.ExitMsg{}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return errExit(errdefs.New(errdefs.Internal, "kill-all: %d processes are left after %d rounds of kill(-1, SIGKILL)", left, round+1))
		}
		// Let the killed die (and the reaper reap) before counting again.
		time.Sleep(time.Millisecond)
	}
}

// liveProcesses counts the processes other than PID 1 that are not
// zombies.
func liveProcesses() (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// pid (comm) S ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
			continue
		}
		n++
	}
	return n, nil
}
