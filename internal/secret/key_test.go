package secret_test

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/secret"
)

// TestLoadKeyRefusesWrongFiles: a key file that is not a regular file of a
// key's size is refused with a message that says so, at once: before, a
// FIFO (a key meant to be piped in) hung the daemon's start with no word,
// and /dev/zero or a disk image given by mistake was read into memory to
// its end.
func TestLoadKeyRefusesWrongFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abcd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte(strings.Repeat("ab", 32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, file, want string }{
		{"fifo", fifo, "not a regular file"},
		{"device", "/dev/zero", "not a regular file"},
		{"directory", dir, "not a regular file"},
		{"oversized", big, "over"},
		{"short", short, "has 2 bytes"},
		{"readable by others", open, "readable by others"},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := secret.LoadKey(c.file, "", false)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("LoadKey(%s): %v, want an error saying %q", c.file, err, c.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("LoadKey(%s) has not returned in 30s", c.file)
			}
		})
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte(hex.EncodeToString(make([]byte, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := secret.LoadKey(good, "", false); err != nil {
		t.Fatalf("a good key file: %v", err)
	}
	for _, v := range []string{"", "zz", "abcd", strings.Repeat("a", 63)} {
		t.Setenv("CLADE_TEST_KEY", v)
		if _, err := secret.LoadKey(good, "CLADE_TEST_KEY", false); err == nil || !strings.Contains(err.Error(), "$CLADE_TEST_KEY") {
			t.Fatalf("$CLADE_TEST_KEY=%q: %v, want an error naming it", v, err)
		}
	}
}
