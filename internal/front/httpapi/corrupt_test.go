package httpapi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// corruptions damage one file of a state image: a flipped byte in the
// middle, or the file cut in half.
var corruptions = []struct {
	name, file string
	damage     func(t *testing.T, path string)
}{
	{"checkpoint.img flipped byte", "checkpoint.img", func(t *testing.T, path string) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, _ := f.Stat()
		b := []byte{0}
		if _, err := f.ReadAt(b, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{b[0] ^ 0x10}, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	}},
	{"pages.img truncated", "pages.img", func(t *testing.T, path string) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	}},
}

// TestCorruptStateImages: a fork of a snapshot, or a wake of a sleeping
// sandbox, whose image was damaged fails at once saying it is corrupt;
// the sleeping sandbox stays asleep and can be removed.
func TestCorruptStateImages(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	src := newSandbox(t, c, sdk.CreateSandboxRequest{})
	if r := run(t, c, src.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo x > /root/f"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	for _, tc := range corruptions {
		t.Run("fork/"+tc.name, func(t *testing.T) {
			snap, err := c.SnapshotSandbox(t.Context(), src.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, filepath.Join(d.DataDir, "snapshots", snap.ID, tc.file))
			t0 := time.Now()
			_, err = c.Fork(t.Context(), snap.ID, 1)
			if err == nil || !strings.Contains(err.Error(), "snapshot "+snap.ID+" is corrupt") || !sdk.IsConflict(err) || time.Since(t0) > 5*time.Second {
				t.Fatalf("fork of a damaged snapshot: %v after %s; want a quick conflict saying it is corrupt", err, time.Since(t0))
			}
			t.Logf("fork: %v", err)
			if err := c.DeleteSnapshot(t.Context(), snap.ID); err != nil {
				t.Fatalf("remove the corrupt snapshot: %v", err)
			}
		})
		t.Run("wake/"+tc.name, func(t *testing.T) {
			sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
			if _, err := c.Sleep(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, filepath.Join(d.DataDir, "sleep", sb.ID, tc.file))
			t0 := time.Now()
			_, err := c.Wake(t.Context(), sb.ID)
			if err == nil || !strings.Contains(err.Error(), "is corrupt") || time.Since(t0) > 5*time.Second {
				t.Fatalf("wake from a damaged image: %v after %s; want a quick error saying it is corrupt", err, time.Since(t0))
			}
			t.Logf("wake: %v", err)
			if got, err := c.GetSandbox(t.Context(), sb.ID); err != nil || got.State != "sleeping" {
				t.Fatalf("after a failed wake: %+v %v; want it still sleeping", got, err)
			}
			if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
				t.Fatalf("remove the sandbox with a corrupt image: %v", err)
			}
		})
	}
}
