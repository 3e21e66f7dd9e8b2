package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteHostFiles(t *testing.T) {
	a := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Run("missing files are written, then follow a rename", func(t *testing.T) {
		etc := t.TempDir()
		a.cfg.Etc = etc
		if err := os.WriteFile(filepath.Join(etc, "hostname"), []byte("buildhost\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		a.writeHostFiles("box-1")
		if got := read(filepath.Join(etc, "hostname")); got != "box-1\n" {
			t.Fatalf("hostname %q", got)
		}
		hosts := read(filepath.Join(etc, "hosts"))
		if !strings.Contains(hosts, "127.0.0.1\tlocalhost\n") || !strings.Contains(hosts, "127.0.1.1\tbox-1\n") {
			t.Fatalf("hosts %q", hosts)
		}
		a.writeHostFiles("box-2")
		if got := read(filepath.Join(etc, "hosts")); !strings.Contains(got, "127.0.1.1\tbox-2\n") || strings.Contains(got, "box-1") {
			t.Fatalf("hosts after a rename %q", got)
		}
		if ents, _ := os.ReadDir(etc); len(ents) != 2 {
			t.Fatalf("etc holds %v, want hostname and hosts only", ents)
		}
	})
	t.Run("the image's own hosts and symlinks are kept", func(t *testing.T) {
		etc := t.TempDir()
		a.cfg.Etc = etc
		own := "127.0.0.1 localhost mine\n"
		if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(own), 0o644); err != nil {
			t.Fatal(err)
		}
		outside := filepath.Join(t.TempDir(), "target")
		if err := os.WriteFile(outside, []byte("outside\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(etc, "hostname")); err != nil {
			t.Fatal(err)
		}
		a.writeHostFiles("box")
		if got := read(filepath.Join(etc, "hosts")); got != own {
			t.Fatalf("the image's hosts became %q", got)
		}
		if got := read(outside); got != "outside\n" {
			t.Fatalf("a write went through the hostname symlink: %q", got)
		}
	})
	t.Run("lines a user added to the written hosts survive a wake and a rename", func(t *testing.T) {
		// `echo "10.0.0.5 db" >> /etc/hosts` is how hosts files are
		// edited; a wake (or a fork child's restore) sends the hostname
		// again, and must not throw such lines away.
		etc := t.TempDir()
		a.cfg.Etc = etc
		a.writeHostFiles("box")
		p := filepath.Join(etc, "hosts")
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("10.0.0.5 db\n"); err != nil {
			t.Fatal(err)
		}
		f.Close()
		a.writeHostFiles("box") // a wake: the same name
		if got := read(p); !strings.Contains(got, "10.0.0.5 db\n") || !strings.Contains(got, "127.0.1.1\tbox\n") {
			t.Fatalf("hosts after a wake %q", got)
		}
		a.writeHostFiles("box-2") // a fork child: another name
		got := read(p)
		if !strings.Contains(got, "10.0.0.5 db\n") || !strings.Contains(got, "127.0.1.1\tbox-2\n") || strings.Contains(got, "\tbox\n") {
			t.Fatalf("hosts after a rename %q", got)
		}
		if !strings.HasPrefix(got, hostsMarker) || !strings.Contains(got, "127.0.0.1\tlocalhost\n") {
			t.Fatalf("hosts lost its marker or localhost: %q", got)
		}
	})
	t.Run("an empty placeholder hosts is written", func(t *testing.T) {
		etc := t.TempDir()
		a.cfg.Etc = etc
		if err := os.WriteFile(filepath.Join(etc, "hosts"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		a.writeHostFiles("box")
		if got := read(filepath.Join(etc, "hosts")); !strings.Contains(got, "127.0.0.1\tlocalhost\n") || !strings.Contains(got, "127.0.1.1\tbox\n") {
			t.Fatalf("hosts %q, want localhost and box", got)
		}
	})
}
