package gvisor_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// BenchmarkAgentFiles splits a file transfer into its hops, on the agent's
// connection alone (no daemon, no HTTP): what gVisor's file system does by
// itself (dd inside), what the link carries with no file system behind it
// (a process's stdin or stdout and /dev/null), and the tar pushes and pulls
// of one large file and of many small ones.
func BenchmarkAgentFiles(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	e, err := gvisor.New(gvisor.Config{StateDir: testenv.TempDir(b), Runsc: testenv.Runsc(b), AgentPath: agentBin})
	if err != nil {
		b.Fatal(err)
	}
	sb, err := e.Create(context.Background(), engine.Spec{ID: "benchfiles000001", RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 1024, Hostname: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Destroy(context.Background(), sb.ID()) })
	g := sb.Guest()
	// The sandbox's CPU time per op (its cgroup: sentry, gofer, the
	// processes inside) tells the work apart from the wait on a loaded
	// host; cpu-ms/op is that, host-ms/op this process's (the host side).
	cpu := func(b *testing.B) func() {
		s0, h0 := sandboxCPU(sb.ID()), selfCPU()
		return func() {
			if s1 := sandboxCPU(sb.ID()); s0 >= 0 && s1 >= 0 {
				b.ReportMetric(float64(s1-s0)/1e6/float64(b.N), "cpu-ms/op")
			}
			b.ReportMetric(float64(selfCPU()-h0)/1e6/float64(b.N), "host-ms/op")
		}
	}
	const size = 256 << 20
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	run := func(b *testing.B, argv ...string) {
		b.Helper()
		p, err := g.Exec(context.Background(), guest.ExecRequest{Argv: argv})
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, p.Stdout)
		_, _ = io.Copy(io.Discard, p.Stderr)
		if st, err := p.Wait(context.Background()); err != nil || st.Code != 0 {
			b.Fatalf("%v: %+v, %v", argv, st, err)
		}
	}
	b.Run("dd-write-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			run(b, "dd", "if=/dev/zero", "of=/var/tmp/dd.bin", "bs=1M", "count=256")
		}
	})
	b.Run("dd-read-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			run(b, "dd", "if=/var/tmp/dd.bin", "of=/dev/null", "bs=1M")
		}
	})
	run(b, "rm", "-f", "/var/tmp/dd.bin")
	b.Run("stdin-devnull-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			p, err := g.Exec(context.Background(), guest.ExecRequest{Argv: []string{"dd", "of=/dev/null", "bs=1M"}, Stdin: true})
			if err != nil {
				b.Fatal(err)
			}
			go func() { _, _ = io.Copy(io.Discard, p.Stdout); _, _ = io.Copy(io.Discard, p.Stderr) }()
			for left := size; left > 0; left -= len(chunk) {
				if _, err := p.Stdin.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			p.Stdin.Close()
			if st, err := p.Wait(context.Background()); err != nil || st.Code != 0 {
				b.Fatalf("%+v, %v", st, err)
			}
		}
	})
	b.Run("stdout-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			p, err := g.Exec(context.Background(), guest.ExecRequest{Argv: []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}})
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, p.Stdout)
			_, _ = io.Copy(io.Discard, p.Stderr)
			if _, err := p.Wait(context.Background()); err != nil || n != size {
				b.Fatalf("got %d bytes, %v", n, err)
			}
		}
	})
	large := func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: "large.bin", Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		for left := size; left > 0; left -= len(chunk) {
			if _, err := tw.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}
	b.Run("push-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			if err := g.CopyIn(context.Background(), "/var/tmp", tarx.Stream(large)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pull-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		defer cpu(b)()
		for b.Loop() {
			rc, err := g.CopyOut(context.Background(), "/var/tmp/large.bin", nil)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n < size {
				b.Fatalf("got %d bytes, %v", n, err)
			}
		}
	})
	run(b, "rm", "-f", "/var/tmp/large.bin")
	const files = 2000
	small := func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: "small/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
		for i := range files {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("small/f%05d", i), Mode: 0o644, Size: 4096, Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			if _, err := tw.Write(chunk[i%200*4096 : i%200*4096+4096]); err != nil {
				return err
			}
		}
		return nil
	}
	b.Run(fmt.Sprintf("push-%d-files", files), func(b *testing.B) {
		defer cpu(b)()
		for b.Loop() {
			if err := g.CopyIn(context.Background(), "/var/tmp", tarx.Stream(small)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(files*b.N)/b.Elapsed().Seconds(), "files/s")
	})
	b.Run(fmt.Sprintf("pull-%d-files", files), func(b *testing.B) {
		defer cpu(b)()
		for b.Loop() {
			rc, err := g.CopyOut(context.Background(), "/var/tmp/small", nil)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n < files*4096 {
				b.Fatalf("got %d bytes, %v", n, err)
			}
		}
		b.ReportMetric(float64(files*b.N)/b.Elapsed().Seconds(), "files/s")
	})
}

// sandboxCPU is the CPU time in ns the sandbox's cgroup used so far (v1
// cpuacct or v2 cpu.stat), or -1.
func sandboxCPU(id string) int64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/clade/" + id + "/cpuacct.usage"); err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil {
			return n
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/clade/" + id + "/cpu.stat"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return n * 1000
				}
			}
		}
	}
	return -1
}

// selfCPU is this process's CPU time in ns.
func selfCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
