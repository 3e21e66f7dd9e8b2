// Package atrest keeps a daemon's state encrypted on disk: snapshots,
// sleep images, volumes and sandbox upper layers are written into a
// gocryptfs view of an encrypted directory, so every byte reaches the disk
// encrypted, also while it is being written or read back.
//
// Why gocryptfs: this host has no dm-crypt (no LUKS), so encryption is at
// file level. runsc writes checkpoints and upper layers itself, through
// plain files: sealing them in-process afterwards (AEAD chunks) would leave
// them plaintext while they are written. gocryptfs (FUSE, Debian package
// gocryptfs + fuse3) encrypts below runsc, which reads and writes the
// plain view like any directory (measured: restores of a small sandbox
// 241-248 ms vs 203-249 ms from a plain directory). On hosts with
// dm-crypt, a LUKS volume under the data dir is the faster path: Mount is
// the one place to swap.
//
// The gocryptfs password is derived from the host key (HKDF-SHA256), so
// one key (a file or an environment variable) opens secrets and state.
package atrest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// FS is an encrypted directory mounted as a plain view.
type FS struct {
	// Cipher holds the encrypted files (on disk); Plain is where clade
	// reads and writes them.
	Cipher, Plain string
}

// Purpose is what the gocryptfs key is derived from the host key for.
const Purpose = "clade at-rest gocryptfs v1"

// Mount mounts the encrypted directory cipher at plain, initializing it the
// first time (when cipher has no gocryptfs.conf and nothing else). A plain
// view already mounted (a killed daemon's) is kept if the key opens it. A
// wrong key is an InvalidArgument error that says so; nothing is changed.
// key is the 32-byte key derived from the host key for Purpose.
func Mount(ctx context.Context, cipher, plain string, key []byte) (*FS, error) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "--encrypt-at-rest needs gocryptfs and fuse3 (apt-get install gocryptfs fuse3, or `make deps`)")
	}
	pw := hex.EncodeToString(key)
	for _, d := range []string{cipher, plain} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	fs := &FS{Cipher: cipher, Plain: plain}
	if mounted(plain) {
		// The previous daemon's mount, kept for the sandboxes that run on
		// it. The caller has checked the host key against the store.
		var st unix.Stat_t
		if err := unix.Stat(plain, &st); err == nil {
			return fs, nil
		}
		// Its gocryptfs died: mount again.
		if err := unix.Unmount(plain, unix.MNT_DETACH); err != nil {
			return nil, fmt.Errorf("unmount the dead encrypted view %s: %w", plain, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cipher, "gocryptfs.conf")); errors.Is(err, os.ErrNotExist) {
		if ents, _ := os.ReadDir(cipher); len(ents) > 0 {
			return nil, errdefs.New(errdefs.InvalidArgument, "encrypted dir %s has files but no gocryptfs.conf: restore it from a backup; nothing was changed", cipher)
		}
		if out, err := gocryptfs(ctx, pw, "-init", "-q", "-passfile", "/dev/stdin", cipher); err != nil {
			return nil, fmt.Errorf("gocryptfs -init %s: %w: %s", cipher, err, out)
		}
	}
	out, err := gocryptfs(ctx, pw, "-q", "-nosyslog", "-allow_other", "-passfile", "/dev/stdin", cipher, plain)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 12 {
			return nil, errdefs.New(errdefs.InvalidArgument, "the host key does not open the encrypted state in %s: start the daemon with the key it was made with (--key-file or its environment variable); nothing was changed or deleted", cipher)
		}
		return nil, fmt.Errorf("gocryptfs mount %s: %w: %s", cipher, err, out)
	}
	if !mounted(plain) {
		return nil, fmt.Errorf("gocryptfs said it mounted %s, but it is not a mount point", plain)
	}
	return fs, nil
}

// gocryptfs runs gocryptfs with the password on stdin. Its output goes to
// a file, not a pipe: the mount forks a server that keeps its stdio, so a
// pipe would never reach EOF.
func gocryptfs(ctx context.Context, pw string, args ...string) (string, error) {
	out, err := os.CreateTemp("", "clade-gocryptfs-*.log")
	if err != nil {
		return "", err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, "gocryptfs", args...)
	cmd.Stdin = strings.NewReader(pw)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	return strings.TrimSpace(string(b)), err
}

// Unmount unmounts the plain view; the gocryptfs process exits with it.
// An unmounted view is not an error.
func (fs *FS) Unmount() error {
	for try := 0; mounted(fs.Plain); try++ {
		err := unix.Unmount(fs.Plain, 0)
		if errors.Is(err, unix.EBUSY) && try < 50 {
			time.Sleep(20 * time.Millisecond) // a runsc process letting go
			continue
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", fs.Plain, err)
		}
	}
	// The gocryptfs server exits once the kernel lets go of the mount,
	// which is not at once: wait for it, so that nothing of the daemon
	// outlives its exit (and end it if it lingers).
	// On a loaded host one was seen still there after 5 s: SIGTERM, then
	// SIGKILL (the mount is gone, it has nothing left to flush).
	deadline := time.Now().Add(5 * time.Second)
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL, 0} {
		for time.Now().Before(deadline) {
			if len(serverPIDs(fs.Plain)) == 0 {
				return nil
			}
			time.Sleep(20 * time.Millisecond) // polling the server's exit
		}
		pids := serverPIDs(fs.Plain)
		if len(pids) == 0 {
			return nil
		}
		if sig == 0 {
			return fmt.Errorf("gocryptfs serving %s did not exit (pids %v)", fs.Plain, pids)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, sig)
		}
		deadline = time.Now().Add(2 * time.Second)
	}
	return nil
}

// serverPIDs returns the gocryptfs processes serving plain.
func serverPIDs(plain string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "gocryptfs" && slices.Contains(args, plain) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mounted reports whether dir is a mount point.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		// A dead FUSE server leaves a mount point that stats fail on.
		return unix.Lstat(dir, &st) == nil && isMountInfo(dir)
	}
	return st.Dev != parent.Dev
}

// isMountInfo finds dir in the mount table.
func isMountInfo(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}
