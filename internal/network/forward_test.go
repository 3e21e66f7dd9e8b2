package network

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestForwardingRestoredByTheLastDaemon: forwarding goes on with the first
// daemon and back to what it was when the last one's table is gone, not
// before. The sysctl is a file here: the real one is shared with other
// tests' daemons.
func TestForwardingRestoredByTheLastDaemon(t *testing.T) {
	dir := t.TempDir()
	oldDir, oldSysctl := forwardDir, forwardSysctl
	forwardDir, forwardSysctl = filepath.Join(dir, "reg"), filepath.Join(dir, "ip_forward")
	t.Cleanup(func() { forwardDir, forwardSysctl = oldDir, oldSysctl })
	read := func() string {
		b, err := os.ReadFile(forwardSysctl)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if err := os.WriteFile(forwardSysctl, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Prefixes no nftables table has: released, they count as gone.
	if err := enableForwarding("cltfa"); err != nil {
		t.Fatal(err)
	}
	if err := enableForwarding("cltfb"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Fatalf("forwarding = %s with two daemons, want 1", got)
	}
	// A registered daemon whose table is gone does not hold it on.
	if err := releaseForwarding("cltfa"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Fatalf("forwarding = %s once no table remains, want the original 0", got)
	}
	if _, err := os.Stat(filepath.Join(forwardDir, "ip_forward.orig")); !os.IsNotExist(err) {
		t.Fatalf("the recorded original is still there: %v", err)
	}
	// A host that forwarded before keeps forwarding.
	if err := os.WriteFile(forwardSysctl, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := enableForwarding("cltfa"); err != nil {
		t.Fatal(err)
	}
	if err := releaseForwarding("cltfa"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Fatalf("forwarding = %s, want the original 1", got)
	}
}
