package httpapi_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestCopyHostile attacks file transfers in a real sandbox: hostile
// archives are refused with a 400 naming the entry and write nothing
// outside the destination; a FIFO is refused or skipped, never waited on;
// and a process inside the sandbox that keeps swapping the directory being
// filled for a symlink out of it cannot redirect the extraction.
func TestCopyHostile(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	sh := func(script string) result {
		t.Helper()
		return run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}})
	}
	tarOf := func(hdrs ...*tar.Header) io.Reader {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Size > 0 && h.Size < 1<<20 { // a huge one: the header alone
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		_ = tw.Flush()
		return &b
	}
	if r := sh("mkdir -p /tmp/dst /tmp/out && mkfifo /tmp/p && mkdir /tmp/fd && mkfifo /tmp/fd/q && echo hi > /tmp/fd/a"); r.err != nil || r.st.Code != 0 {
		t.Fatalf("setup: %+v", r)
	}

	t.Run("hostile entries", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			hdrs []*tar.Header
		}{
			{"dotdot", []*tar.Header{{Name: "../../etc/evil", Typeflag: tar.TypeReg, Size: 1}}},
			{"absolute", []*tar.Header{{Name: "/etc/evil", Typeflag: tar.TypeReg, Size: 1}}},
			{"through symlink", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, {Name: "l/evil", Typeflag: tar.TypeReg, Size: 1}}},
			{"hardlink out", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
			{"hardlink through symlink", []*tar.Header{{Name: "l2", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, {Name: "h2", Typeflag: tar.TypeLink, Linkname: "l2/passwd"}}},
			{"device", []*tar.Header{{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}},
			{"fifo", []*tar.Header{{Name: "p", Typeflag: tar.TypeFifo}}},
			{"huge", []*tar.Header{{Name: "big", Typeflag: tar.TypeReg, Size: 1 << 40}}},
		} {
			err := c.CopyTo(t.Context(), sb.ID, "/tmp/dst", tarOf(tc.hdrs...))
			if !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tar entry") {
				t.Errorf("%s: %v, want an invalid-argument error naming the entry", tc.name, err)
			}
		}
		if r := sh("ls /etc/evil 2>/dev/null; stat -c %h /etc/passwd"); r.stdout != "1\n" {
			t.Errorf("after the hostile archives: %q, want no /etc/evil and /etc/passwd unlinked", r.stdout)
		}
	})

	t.Run("pull fifo", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if _, err := c.CopyFrom(ctx, sb.ID, "/tmp/p"); !sdk.IsInvalidArgument(err) {
			t.Errorf("copy of a FIFO: %v, want invalid argument", err)
		}
		rc, err := c.CopyFrom(ctx, sb.ID, "/tmp/fd")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		var names []string
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
		}
		if fmt.Sprint(names) != "[fd/ fd/a]" {
			t.Errorf("copy of a directory holding a FIFO: %v, want [fd/ fd/a]", names)
		}
	})

	t.Run("racing swapper", func(t *testing.T) {
		// The swapper runs until the test cancels it.
		ctx, cancel := context.WithCancel(t.Context())
		swapped := make(chan result, 1)
		go func() {
			var out bytes.Buffer
			st, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Stdout: &out, Cmd: []string{"sh", "-c",
				"mkdir -p /tmp/r/d; n=0; while [ ! -e /tmp/stop ]; do mv /tmp/r/d /tmp/r/m && ln -s /tmp/out /tmp/r/d && n=$((n+1)); rm -f /tmp/r/d; mv /tmp/r/m /tmp/r/d; done; echo $n"}})
			swapped <- result{out.String(), "", st, err}
		}()
		var hdrs []*tar.Header
		for i := range 2000 {
			hdrs = append(hdrs, &tar.Header{Name: fmt.Sprintf("d/f%d", i), Typeflag: tar.TypeReg, Size: 1})
			if i%50 == 0 {
				hdrs = append(hdrs, &tar.Header{Name: fmt.Sprintf("d/h%d", i), Typeflag: tar.TypeLink, Linkname: fmt.Sprintf("d/f%d", i)})
			}
		}
		var buf bytes.Buffer
		_, _ = io.Copy(&buf, tarOf(hdrs...))
		for range 5 {
			// Errors are expected (a parent is a symlink, a directory
			// vanished); what matters is where the files went.
			err := c.CopyTo(t.Context(), sb.ID, "/tmp/r", bytes.NewReader(buf.Bytes()))
			t.Logf("push while swapping: %v", err)
		}
		sh("touch /tmp/stop")
		var r result
		select {
		case r = <-swapped:
		case <-time.After(60 * time.Second):
			cancel()
			t.Fatal("the swapper did not stop")
		}
		cancel()
		if r.err != nil || strings.TrimSpace(r.stdout) == "0" {
			t.Fatalf("swapper: %+v, want it to have swapped", r)
		}
		t.Logf("swaps: %s", strings.TrimSpace(r.stdout))
		if out := sh("ls -A /tmp/out | wc -l"); strings.TrimSpace(out.stdout) != "0" {
			t.Fatalf("%s entries landed outside the destination", strings.TrimSpace(out.stdout))
		}
	})
}
