// Package nothp starts a command with transparent huge pages turned off
// for it, through a launcher binary that calls Main first thing.
//
// Why: QEMU asks for huge pages (MADV_HUGEPAGE) on its TCG translation
// cache and its anonymous RAM blocks (the firmware's), so on a host whose
// THP mode is "madvise" or "always" a fork child that has written a few
// bytes of such a block holds a whole 2 MiB page of its own: ~2 MiB more
// per child, measured (docs/benchmarks.md, issue 14). PR_SET_THP_DISABLE
// is per process, kept across fork and execve, and Go cannot run it
// between its fork and exec, hence a launcher. clade-agent is it: a small
// static binary that starts in ~2 ms (the daemon's own binary takes ~9 ms
// of package initialisation first).
package nothp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// argv0 marks a process started as the launcher: its argv[0], which only
// the process that starts it sets. An environment variable would not do:
// the agent is also PID 1 of every sandbox, started with the environment
// its user asks for (clade create --env, an image's ENV), and a marker
// there made it exec its own missing argument instead of serving.
const argv0 = "clade-no-thp-exec"

// Main returns at once unless this process was started by Command; then it
// turns THP off for itself and execs the command in its arguments, and
// never returns.
func Main() {
	if len(os.Args) == 0 || os.Args[0] != argv0 {
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "clade: the no-THP launcher needs a command")
		os.Exit(127)
	}
	// Best effort: a kernel without THP says EINVAL, and the command runs
	// all the same.
	_ = unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0)
	err := syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "clade: exec %s: %v\n", os.Args[1], err)
	os.Exit(127)
}

// Command is exec.CommandContext(ctx, argv[0], argv[1:]...) started through
// launcher, a binary that calls Main first; argv[0] must be a path.
func Command(ctx context.Context, launcher string, argv []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, launcher, argv...)
	cmd.Args[0] = argv0
	return cmd
}
