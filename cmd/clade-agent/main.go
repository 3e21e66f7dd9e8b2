// Command clade-agent is the in-sandbox agent: PID 1 of every clade sandbox.
// It is a separate, small static binary (not a subcommand of clade) because
// every sandbox's memory image carries it: every byte it touches is copied
// into each forked child.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/nothp"
	"github.com/clade-sandbox/clade/internal/vminit"
	"golang.org/x/sys/unix"
)

// SocketEnv names the variable that tells the agent where the host listens.
const SocketEnv = "CLADE_AGENT_SOCKET"

func main() {
	// On the host, the qemu engine starts QEMU through this binary.
	nothp.Main()
	runtime.GOMAXPROCS(1)
	if vminit.IsVM() {
		// The first stage of a qemu guest: it execs the agent again from
		// the sandbox's root, or fails and the VM powers off.
		_ = vminit.Main(SocketEnv)
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		os.Exit(1)
	}
	sock := os.Getenv(SocketEnv)
	if sock == "" {
		fmt.Fprintln(os.Stderr, "clade-agent runs inside a clade sandbox; "+SocketEnv+" is not set")
		os.Exit(2)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CLADE_AGENT_") {
			env = append(env, kv)
		}
	}
	// The agent keeps CAP_SYS_ADMIN (to set a restored copy's hostname) but
	// drops it from the bounding set, so nothing it starts inherits it.
	_ = unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0)
	// Its key (see internal/guest/auth.go) lives in its memory only:
	// nothing else in the sandbox, root as they all are, may read that
	// memory (/proc/1/mem, ptrace), which takes a non-dumpable agent and
	// no CAP_SYS_PTRACE in what it starts.
	_ = unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_PTRACE, 0, 0, 0)
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a := agent.New(agent.Config{Socket: sock, BaseEnv: env, Log: log,
		Workdir: os.Getenv("CLADE_AGENT_WORKDIR"), User: os.Getenv("CLADE_AGENT_USER"), Etc: "/etc"})
	if err := a.Run(context.Background()); err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}
