package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/nftables"
)

// IPv4 forwarding is a host-wide switch that sandbox egress needs on. A
// host that had it off must not be left a router once clade no longer
// needs it, but several daemons (each with its own prefix, e.g. test
// daemons) may share the host, so the switch is shared through a small
// registry in /run (a tmpfs: it goes at reboot, as the setting does):
//
//	/run/clade-network/ip_forward.orig   the value before the first daemon
//	/run/clade-network/users/<prefix>    one per daemon whose table exists
//
// A daemon registers before it turns forwarding on and unregisters when it
// deletes its nftables table (no slot held); the last one out restores the
// original value. A daemon killed with its table in place stays registered
// until a later daemon of the same prefix closes; one whose table is gone
// (removed by hand) is dropped by whoever looks next.
var forwardDir = "/run/clade-network"

var forwardSysctl = "/proc/sys/net/ipv4/ip_forward"

// registryDir is the registry of the daemon's network namespace: the
// switch is one per namespace, so a daemon run in a namespace of its own
// (a cluster test's node) keeps a registry of its own, under
// forwardDir/netns-INODE, and neither counts nor restores the host's.
func registryDir() string {
	self, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return forwardDir
	}
	initNS, err := os.Stat("/proc/1/ns/net")
	if err != nil || os.SameFile(self, initNS) {
		return forwardDir
	}
	st, ok := self.Sys().(*syscall.Stat_t)
	if !ok {
		return forwardDir
	}
	return filepath.Join(forwardDir, fmt.Sprintf("netns-%d", st.Ino))
}

// lockForward takes the registry's lock.
func lockForward() (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Join(registryDir(), "users"), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(registryDir(), "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// enableForwarding registers prefix and turns IPv4 forwarding on,
// recording the value it had if nobody did yet.
func enableForwarding(prefix string) error {
	unlock, err := lockForward()
	if err != nil {
		return fmt.Errorf("ip forwarding registry: %w", err)
	}
	defer unlock()
	orig := filepath.Join(registryDir(), "ip_forward.orig")
	if _, err := os.Stat(orig); errors.Is(err, os.ErrNotExist) {
		cur, err := os.ReadFile(forwardSysctl)
		if err != nil {
			return fmt.Errorf("read IPv4 forwarding: %w", err)
		}
		if err := os.WriteFile(orig, cur, 0o600); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(registryDir(), "users", prefix), nil, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(forwardSysctl, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	return nil
}

// releaseForwarding unregisters prefix (its table is gone) and, when no
// registered daemon's table remains, puts IPv4 forwarding back as it was.
func releaseForwarding(prefix string) error {
	unlock, err := lockForward()
	if err != nil {
		return fmt.Errorf("ip forwarding registry: %w", err)
	}
	defer unlock()
	users := filepath.Join(registryDir(), "users")
	if err := os.Remove(filepath.Join(users, prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ents, err := os.ReadDir(users)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if tableExists(e.Name()) {
			return nil // still needed
		}
		_ = os.Remove(filepath.Join(users, e.Name()))
	}
	orig := filepath.Join(registryDir(), "ip_forward.orig")
	b, err := os.ReadFile(orig)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if v := strings.TrimSpace(string(b)); v == "0" || v == "1" {
		if err := os.WriteFile(forwardSysctl, []byte(v), 0o644); err != nil {
			return fmt.Errorf("restore IPv4 forwarding: %w", err)
		}
	}
	return os.Remove(orig)
}

// tableExists says whether the nftables table of a daemon with prefix is
// in place. When it cannot tell, it says yes: forwarding stays on rather
// than cutting a running sandbox off.
func tableExists(prefix string) bool {
	c, err := newConn()
	if err != nil {
		return true
	}
	t, err := c.ListTableOfFamily(prefix, nftables.TableFamilyINet)
	if err != nil {
		return !errors.Is(err, syscall.ENOENT)
	}
	return t != nil
}
