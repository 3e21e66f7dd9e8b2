package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// A prefix names host-wide resources (namespaces, veths, the nftables
// table) and a range names addresses. A second daemon on the same prefix
// would take the first one's slots for a killed daemon's leftovers and
// remove them, and one on an overlapping range would hand out addresses
// the first one routes. So each daemon holds an exclusive lock on a file
// named for its prefix for as long as it runs (the kernel drops it when
// the process dies, SIGKILL included) and writes its pid and range in it,
// so that a daemon starting later can name the one it clashes with.
var claimDir = filepath.Join(forwardDir, "prefixes")

// claimPrefix takes prefix and rng for this process, or says which daemon
// holds them. The returned file holds the lock until it is closed.
func claimPrefix(prefix string, rng netip.Prefix) (*os.File, error) {
	unlock, err := lockForward() // one claim at a time, host-wide
	if err != nil {
		return nil, fmt.Errorf("network prefix registry: %w", err)
	}
	defer unlock()
	if err := os.MkdirAll(claimDir, 0o700); err != nil {
		return nil, fmt.Errorf("network prefix registry: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(claimDir, prefix), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network prefix registry: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := readClaim(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errdefs.New(errdefs.Conflict, "network prefix %q is in use by another clade daemon on this host (pid %s): give each daemon its own --network-prefix and --network-range", prefix, pid)
		}
		return nil, fmt.Errorf("lock network prefix %q: %w", prefix, err)
	}
	ents, _ := os.ReadDir(claimDir)
	for _, e := range ents {
		if e.Name() == prefix {
			continue
		}
		pid, other, held := heldClaim(filepath.Join(claimDir, e.Name()))
		if held && other.IsValid() && other.Overlaps(rng) {
			f.Close()
			return nil, errdefs.New(errdefs.Conflict, "network range %s overlaps %s of the clade daemon with network prefix %q (pid %s): give this daemon a range of its own with --network-range", rng, other, e.Name(), pid)
		}
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+rng.String()+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("network prefix registry: %w", err)
	}
	return f, nil
}

// heldClaim reads the claim file at path and says whether a live daemon
// holds it.
func heldClaim(path string) (pid string, rng netip.Prefix, held bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", netip.Prefix{}, false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		return "", netip.Prefix{}, false // nobody holds it: a daemon that has gone
	}
	pid, rng = readClaim(f)
	return pid, rng, true
}

func readClaim(f *os.File) (pid string, rng netip.Prefix) {
	b := make([]byte, 128)
	n, _ := f.ReadAt(b, 0)
	fields := strings.Fields(string(b[:n]))
	if len(fields) != 2 {
		return "?", netip.Prefix{}
	}
	rng, _ = netip.ParsePrefix(fields[1])
	return fields[0], rng
}
