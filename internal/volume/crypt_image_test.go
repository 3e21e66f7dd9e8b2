package volume

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
			size, err := checkImage(img)
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
