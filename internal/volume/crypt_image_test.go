package volume

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestCheckImageRefusesUncheckedJournal: an imported image that e2fsck -n
// passes but whose mount would replay a journal nobody checked, or open
// an external journal device, is refused; a clean one is taken.
func TestCheckImageRefusesUncheckedJournal(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	for _, tc := range []struct{ name, debugfs, want string }{
		{"clean", "", ""},
		{"needs-recovery", "feature needs_recovery", "journal needs recovery"},
		{"external-journal", "ssv journal_dev 0x801", "external journal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "disk.img")
			if err := os.WriteFile(img, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(img, MinSize); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
				t.Fatalf("mkfs: %v: %s", err, out)
			}
			if tc.debugfs != "" {
				if out, err := exec.Command("debugfs", "-w", "-R", tc.debugfs, img).CombinedOutput(); err != nil {
					t.Fatalf("debugfs: %v: %s", err, out)
				}
			}
			size, err := checkImage(t.Context(), img)
			if tc.want == "" {
				if err != nil || size != MinSize {
					t.Fatalf("clean image: size %d, err %v; want %d, nil", size, err, MinSize)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkImage = %d, %v; want an error saying %q", size, err, tc.want)
			}
		})
	}
}

// TestFsckDeadline: an e2fsck that never finishes (here a stand-in that
// hangs, with a child of its own) is killed at the deadline, its child
// too, and the image is refused saying so.
func TestFsckDeadline(t *testing.T) {
	bin := t.TempDir()
	marker := "clade-fsck-hang-" + filepath.Base(bin)
	if err := os.WriteFile(filepath.Join(bin, "e2fsck"), []byte("#!/bin/sh\nsh -c 'sleep 600; :' "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	err := fsck(t.Context(), img, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("fsck of a hanging check = %v, want a deadline error", err)
	}
	if d := time.Since(t0); d > 4*time.Second {
		t.Fatalf("fsck returned after %s: the hanging check was not killed at its deadline", d)
	}
	// Nothing of the check is left running.
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := testenv.ProcessesMentioning(marker)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed check's processes are still there: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Through checkImage, the refusal is the import's InvalidArgument.
	old := fsckTimeout
	fsckTimeout = func(int64) time.Duration { return 200 * time.Millisecond }
	t.Cleanup(func() { fsckTimeout = old })
	if err := os.Truncate(img, MinSize); err != nil {
		t.Fatal(err)
	}
	real := "/sbin/mkfs.ext4"
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		real = p
	}
	if out, err := exec.Command(real, "-q", "-F", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs: %v: %s", err, out)
	}
	_, err = checkImage(t.Context(), img)
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("checkImage with a hanging e2fsck = %v, want InvalidArgument", err)
	}
	if !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("checkImage error %q does not say the check timed out", err)
	}
}
