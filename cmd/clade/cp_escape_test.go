package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestCLICopyOutEscape plays a sandbox that answers two successive
// `clade cp box:/out DST` with a symlink to a host directory first and a
// directory of files second, in a real sandbox: the second copy must write
// at DST, never into the host directory the first one's link names.
func TestCLICopyOutEscape(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create", "--memory", "256")
	if code != 0 {
		t.Fatalf("create: %q %q %d", out, errs, code)
	}
	id := strings.TrimSpace(out)
	base := t.TempDir()
	// outside makes a host directory for the sandbox to name.
	outside := func(name string) string {
		t.Helper()
		p := filepath.Join(base, "outside-"+name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sh := func(script string) {
		t.Helper()
		if out, errs, code := cli(t, d, "", "exec", id, "--", "sh", "-c", script); code != 0 {
			t.Fatalf("%s: %q %q %d", script, out, errs, code)
		}
	}
	cp := func(src, dst string) (string, int) {
		t.Helper()
		_, errs, code := cli(t, d, "", "cp", id+":"+src, dst)
		return errs, code
	}
	nothingOutside := func(outside string) {
		t.Helper()
		ents, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			t.Errorf("the copy wrote %s outside its destination", filepath.Join(outside, e.Name()))
		}
	}

	t.Run("DST made a symlink", func(t *testing.T) {
		dst := filepath.Join(base, "dst")
		outside := outside("dst")
		sh("ln -s " + outside + " /out")
		if errs, code := cp("/out", dst); code != 0 {
			t.Fatalf("first cp: %s", errs)
		}
		if l, err := os.Readlink(dst); err != nil || l != outside {
			t.Fatalf("after the first cp DST is %q, %v; want the sandbox's symlink", l, err)
		}
		sh("rm /out && mkdir /out && echo evil > /out/evil")
		if errs, code := cp("/out", dst); code != 0 {
			t.Fatalf("second cp: %s", errs)
		}
		nothingOutside(outside)
		if b, err := os.ReadFile(filepath.Join(dst, "evil")); err != nil || string(b) != "evil\n" {
			t.Errorf("DST/evil = %q, %v; want the sandbox's file at DST, the link replaced", b, err)
		}
	})

	t.Run("link inside DST", func(t *testing.T) {
		dst := filepath.Join(base, "into")
		outside := outside("into")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		sh("mkdir /out2 && ln -s " + outside + " /out2/l")
		if errs, code := cp("/out2", dst); code != 0 {
			t.Fatalf("first cp: %s", errs)
		}
		sh("rm /out2/l && mkdir /out2/l && echo evil > /out2/l/evil")
		if errs, code := cp("/out2", dst); code != 0 {
			t.Fatalf("second cp: %s", errs)
		}
		nothingOutside(outside)
		if b, err := os.ReadFile(filepath.Join(dst, "out2", "l", "evil")); err != nil || string(b) != "evil\n" {
			t.Errorf("DST/out2/l/evil = %q, %v; want the sandbox's file there", b, err)
		}
	})

	t.Run("trailing slash", func(t *testing.T) {
		// DST/ names a directory that must exist: the copy never makes
		// DST, so it cannot plant a link there for a later DST/ to follow.
		dst := filepath.Join(base, "slash")
		outside := outside("slash")
		sh("ln -s " + outside + " /out3")
		if errs, code := cp("/out3", dst+"/"); code == 0 || !strings.Contains(errs, "does not exist") {
			t.Fatalf("cp into a missing DST/: %q %d, want an error saying it does not exist", errs, code)
		}
		if _, err := os.Lstat(dst); !os.IsNotExist(err) {
			t.Fatalf("cp into a missing DST/ made it: %v", err)
		}
		sh("rm /out3 && mkdir /out3 && echo evil > /out3/evil")
		if errs, code := cp("/out3", dst+"/"); code == 0 {
			t.Fatalf("second cp into a missing DST/ succeeded: %s", errs)
		}
		nothingOutside(outside)
	})
}
