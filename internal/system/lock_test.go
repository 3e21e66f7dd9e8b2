package system

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSecondDaemonOnDataDir: a daemon started on a data dir another one
// holds says which process holds it and what to do, before anything else.
func TestSecondDaemonOnDataDir(t *testing.T) {
	dir := t.TempDir()
	f, err := os.OpenFile(filepath.Join(dir, "daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("4242\n"); err != nil {
		t.Fatal(err)
	}
	err = Run(t.Context(), Options{DataDir: dir, Socket: filepath.Join(dir, "s.sock")})
	if err == nil || !strings.Contains(err.Error(), "(pid 4242) is using data dir "+dir) || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("second daemon: %v; want the holder's pid and what to do", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("the refused daemon made %d entries in the data dir, want only the lock", len(ents))
	}
}
