package gvisor_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// BenchmarkAgent measures the host <-> agent link alone, under the daemon:
// a ping, an exec that needs no process (command not found), and `true`.
func BenchmarkAgent(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	e, err := gvisor.New(gvisor.Config{StateDir: testenv.TempDir(b), Runsc: testenv.Runsc(b), AgentPath: agentBin})
	if err != nil {
		b.Fatal(err)
	}
	sb, err := e.Create(context.Background(), engine.Spec{ID: "benchagent000001", RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 256, Hostname: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Destroy(context.Background(), sb.ID()) })
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := sb.Guest().Ping(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Throughput of the link: 64 MiB of a process's stdout to the host.
	b.Run("stdout-64MiB", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for b.Loop() {
			p, err := sb.Guest().Exec(context.Background(), guest.ExecRequest{Argv: []string{"head", "-c", "67108864", "/dev/zero"}})
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, p.Stdout)
			_, _ = io.Copy(io.Discard, p.Stderr)
			if _, err := p.Wait(context.Background()); err != nil || n != 64<<20 {
				b.Fatalf("got %d bytes, %v", n, err)
			}
		}
	})
	// The same work with nothing crossing the link, to tell the link's
	// cost from the sandbox's.
	b.Run("devnull-64MiB", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for b.Loop() {
			p, err := sb.Guest().Exec(context.Background(), guest.ExecRequest{Argv: []string{"sh", "-c", "head -c 67108864 /dev/zero >/dev/null"}})
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, p.Stdout)
			_, _ = io.Copy(io.Discard, p.Stderr)
			if st, err := p.Wait(context.Background()); err != nil || st.Code != 0 {
				b.Fatalf("%+v, %v", st, err)
			}
		}
	})
	for _, argv := range [][]string{{"no-such-command"}, {"/bin/true"}} {
		b.Run(argv[0], func(b *testing.B) {
			for b.Loop() {
				p, err := sb.Guest().Exec(context.Background(), guest.ExecRequest{Argv: argv})
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, p.Stdout)
				_, _ = io.Copy(io.Discard, p.Stderr)
				if _, err := p.Wait(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSleep times a checkpoint that stops the sandbox (what sleep
// does), with the sandbox's create and destroy outside the timer; it
// reports the median too.
func BenchmarkSleep(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	dir := testenv.TempDir(b)
	e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: testenv.Runsc(b), AgentPath: agentBin})
	if err != nil {
		b.Fatal(err)
	}
	var times []time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		id := fmt.Sprintf("benchsleep%06d", i)
		sb, err := e.Create(context.Background(), engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 256, Hostname: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		img := filepath.Join(dir, "img-"+id)
		b.StartTimer()
		t0 := time.Now()
		if err := e.Checkpoint(context.Background(), id, img, false); err != nil {
			b.Fatal(err)
		}
		<-sb.Exited()
		times = append(times, time.Since(t0))
		b.StopTimer()
		if err := e.Destroy(context.Background(), id); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(img)
		b.StartTimer()
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
}

// BenchmarkCreate times Create, without and with a disk cap.
func BenchmarkCreate(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	e, err := gvisor.New(gvisor.Config{StateDir: testenv.TempDir(b), Runsc: testenv.Runsc(b), AgentPath: agentBin})
	if err != nil {
		b.Fatal(err)
	}
	for _, disk := range []int{0, 1024} {
		b.Run(fmt.Sprintf("disk=%d", disk), func(b *testing.B) {
			var times []time.Duration
			i := 0
			for b.Loop() {
				i++
				id := fmt.Sprintf("benchcreate%05d", disk+i)
				t0 := time.Now()
				if _, err := e.Create(context.Background(), engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 256, DiskMiB: disk, Hostname: "bench"}); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(t0))
				b.StopTimer()
				if err := e.Destroy(context.Background(), id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
		})
	}
}
