package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadKeyFile: a key file that is not a small regular file (empty,
// huge, a FIFO nobody writes, a directory, a symlink to /dev/zero) is
// refused at once with a message naming it, never read until it ends.
func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	key := strings.Repeat("ab", 32)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	good := write("good", []byte(key+"\n"))
	for _, tc := range []struct {
		name, path, want string
	}{
		{"empty", write("empty", nil), "is empty"},
		{"blank", write("blank", []byte(" \n\n")), "is empty"},
		{"huge", write("huge", make([]byte, 64<<20)), "is over"},
		{"fifo", fifo, "not a regular file"},
		{"directory", dir, "not a regular file"},
		{"dev-zero", zero, "not a regular file"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := readKeyFile(tc.path); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("readKeyFile(%s) = %v, want an error saying %q", tc.name, err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("readKeyFile(%s) still reading after 10s", tc.name)
			}
		})
	}
	if got, err := readKeyFile(good); err != nil || got != key {
		t.Fatalf("a good key file: %q, %v", got, err)
	}
}
