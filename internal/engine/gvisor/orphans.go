package gvisor

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Orphans: the runsc processes of an id that no engine drives any more.
//
// A daemon killed while a runsc call about a sandbox runs (`runsc restore`
// most of all: it is the longest) leaves that call running on, orphaned,
// and the call goes on to start the sandbox's gofer and sandbox processes.
// The next daemon destroys the id and restores it again in place: an
// orphan still at work then races the new restore for the id's files in
// runsc's root, the control socket above all (runsc-<id>.sock: a restore
// that finds it taken binds its own elsewhere, and the engine's checkpoint
// then dials the dead one, "connection refused"). So before the engine
// lays out a sandbox afresh, and when it destroys one, it ends every
// process of the id and waits until they are gone, then removes what they
// left in runsc's root.
//
// A process is the id's when its command line names this engine's runsc
// root (--root, which differs for every data dir: several daemons share a
// host in tests) and ends with the id (runsc puts the container id last),
// or names the sandbox's own directory. Never by a broader pattern: the
// same id under another root is another daemon's.

// orphanWait bounds endProcesses: kills and waits, round after round
// (a round can find children a killed process started meanwhile).
var orphanWait = 30 * time.Second

// ownedBy says whether the command line args (split at NULs) is a process
// of sandbox id under runsc root runRoot, whose directory is dir.
func ownedBy(args []string, runRoot, dir, id string) bool {
	if len(args) == 0 {
		return false
	}
	root := false
	for i, a := range args {
		if a == "--root="+runRoot || (a == "--root" && i+1 < len(args) && args[i+1] == runRoot) {
			root = true
		}
	}
	if root && args[len(args)-1] == id {
		return true
	}
	for _, a := range args {
		// --bundle DIR, --bundle=DIR, --pid-file DIR/pid,
		// --overlay2 root:dir=DIR/upper.
		if a == dir || strings.HasPrefix(a, dir+"/") || strings.HasSuffix(a, "="+dir) || strings.Contains(a, "="+dir+"/") {
			return true
		}
	}
	return false
}

// idProcesses lists the processes of sandbox id (ownedBy), this one aside.
func (e *Engine) idProcesses(id string) []proc {
	dir := e.dir(id)
	return procsWhere(func(cmdline string) bool {
		// Empty: a kernel thread or a zombie.
		return cmdline != "" && ownedBy(strings.Split(strings.TrimSuffix(cmdline, "\x00"), "\x00"), e.runRoot, dir, id)
	})
}

// endProcesses SIGKILLs every process of id and waits until none is left
// (up to orphanWait): a killed `runsc restore` may have started a child
// between one listing and its kill, which the next round finds. It
// returns how many it ended.
func (e *Engine) endProcesses(id string) (int, error) {
	deadline := time.Now().Add(orphanWait)
	ended := 0
	for {
		left := e.idProcesses(id)
		if len(left) == 0 {
			return ended, nil
		}
		if time.Now().After(deadline) {
			return ended, fmt.Errorf("sandbox %s: %d runsc processes of it outlived SIGKILL for %s (pids %v)", id, len(left), orphanWait, pidsOf(left))
		}
		for _, p := range left {
			fd, err := unix.PidfdOpen(p.pid, 0)
			if err != nil {
				continue // gone already
			}
			if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
				_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
				ended++
			}
			unix.Close(fd)
		}
	}
}

func pidsOf(ps []proc) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.pid
	}
	return out
}

// endOrphans ends what a killed daemon's runsc calls about id left running
// before id is laid out afresh (its directory is gone: any process of it
// is nobody's), and removes their files in runsc's root: its record and
// its control socket, which the new sandbox takes.
func (e *Engine) endOrphans(id string) error {
	if _, err := thawCgroup(id); err != nil {
		e.cfg.Log.Warn("thawing a sandbox's cgroup before its start", "sandbox", id, "err", err)
	}
	n, err := e.endProcesses(id)
	if err != nil {
		return err
	}
	if n > 0 {
		e.cfg.Log.Warn("ended runsc processes of a sandbox that a killed daemon left running", "sandbox", id, "processes", n)
	}
	return e.removeStateFiles(id)
}
