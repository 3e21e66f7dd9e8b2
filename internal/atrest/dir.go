package atrest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Per-volume encryption (package volume) keeps each encrypted volume's
// image in a gocryptfs directory of its own, opened with that volume's
// key: the directory plus its key is all another host needs to open it.
// On a host with dm-crypt a LUKS container in the volume's directory
// would take its place behind the same two calls.

// ErrWrongKey is what OpenDir returns when key does not open cipher.
var ErrWrongKey = errors.New("the key does not open this encrypted directory")

// InitDir makes cipher, which must not exist, a new gocryptfs directory
// whose password is key (hex of 32 random bytes). key is already a
// random 256-bit secret, so scrypt's cost is set low (2^10): a wake
// mounts it again.
func InitDir(ctx context.Context, cipher, key string) error {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "encrypted volumes need gocryptfs and fuse3 (apt-get install gocryptfs fuse3, or `make deps`)")
	}
	if err := os.Mkdir(cipher, 0o700); err != nil {
		return err
	}
	if out, err := gocryptfs(ctx, key, "-init", "-q", "-scryptn", "10", "-passfile", "/dev/stdin", cipher); err != nil {
		return errors.Join(fmt.Errorf("gocryptfs -init %s: %w: %s", cipher, err, out), os.RemoveAll(cipher))
	}
	return nil
}

// OpenDir mounts the gocryptfs directory cipher at plain with key; a
// view already mounted there is kept. A key that does not open it is
// ErrWrongKey, and nothing is changed.
func OpenDir(ctx context.Context, cipher, plain, key string) (*FS, error) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "encrypted volumes need gocryptfs and fuse3 (apt-get install gocryptfs fuse3, or `make deps`)")
	}
	fs := &FS{Cipher: cipher, Plain: plain}
	if Mounted(plain) {
		var st unix.Stat_t
		if unix.Stat(plain, &st) == nil {
			return fs, nil
		}
		// Its gocryptfs died (killed with the daemon's cgroup?).
		if err := unix.Unmount(plain, unix.MNT_DETACH); err != nil {
			return nil, fmt.Errorf("unmount the dead encrypted view %s: %w", plain, err)
		}
	}
	if err := os.MkdirAll(plain, 0o700); err != nil {
		return nil, err
	}
	out, err := gocryptfs(ctx, key, "-q", "-nosyslog", "-passfile", "/dev/stdin", cipher, plain)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 12 {
			return nil, ErrWrongKey
		}
		return nil, fmt.Errorf("gocryptfs mount %s: %w: %s", cipher, err, out)
	}
	if !Mounted(plain) {
		return nil, fmt.Errorf("gocryptfs said it mounted %s, but it is not a mount point", plain)
	}
	return fs, nil
}

// Mounted reports whether dir is a mount point, also when the FUSE server
// behind it is dead.
func Mounted(dir string) bool { return mounted(dir) }

// UnmountDir unmounts a view mounted at plain (a live or a dead one) and
// waits for its gocryptfs to exit. Nothing mounted there is not an error.
func UnmountDir(plain string) error {
	fs := &FS{Plain: filepath.Clean(plain)}
	var st unix.Stat_t
	if mounted(fs.Plain) && unix.Stat(fs.Plain, &st) != nil {
		// Dead server: a plain unmount would be refused as busy.
		if err := unix.Unmount(fs.Plain, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount the dead encrypted view %s: %w", fs.Plain, err)
		}
	}
	return fs.Unmount()
}
