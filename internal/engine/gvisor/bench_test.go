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

// BenchmarkRestoreFlags compares runsc's restore levers side by side: a
// sandbox whose background process holds 64 MiB is checkpointed plainly and
// with --exclude-committed-zero-pages, then restored from each image with
// and without --background, interleaved, until the restored sandbox answers
// an exec. It reports each variant's median.
func BenchmarkRestoreFlags(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	dir := testenv.TempDir(b)
	engine0 := func(ckpt, restore []string) *gvisor.Engine {
		e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: testenv.Runsc(b), AgentPath: agentBin, CheckpointFlags: ckpt, RestoreFlags: restore})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	plain := engine0(nil, nil)
	ctx := context.Background()
	hold := `import os, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
open("/tmp/held", "w").close()
time.sleep(100000)
`
	imgs := map[string]string{}
	for i, c := range []struct {
		name  string
		flags []string
	}{{"plain", nil}, {"zeroexcl", []string{"--exclude-committed-zero-pages"}}} {
		e := engine0(c.flags, nil)
		parent, err := e.Create(ctx, engine.Spec{ID: fmt.Sprintf("benchrestorepar%d", i), RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 256, Hostname: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Destroy(ctx, parent.ID()) })
		p, err := parent.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "python3 -c \"$0\" && until [ -e /tmp/held ]; do sleep 0.05; done", hold}})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
			b.Fatalf("hold: %+v %v", st, err)
		}
		img := filepath.Join(dir, "img-"+c.name)
		if err := e.Checkpoint(ctx, parent.ID(), img, true); err != nil {
			b.Fatalf("checkpoint %s: %v", c.name, err)
		}
		imgs[c.name] = img
	}
	type variant struct {
		name, img string
		e         *gvisor.Engine
		times     []time.Duration
	}
	vs := []*variant{
		{name: "plain", img: imgs["plain"], e: plain},
		{name: "plain+background", img: imgs["plain"], e: engine0(nil, []string{"--background"})},
		{name: "zeroexcl", img: imgs["zeroexcl"], e: plain},
		{name: "zeroexcl+background", img: imgs["zeroexcl"], e: engine0(nil, []string{"--background"})},
	}
	n := 0
	for b.Loop() {
		for _, v := range vs {
			n++
			id := fmt.Sprintf("benchrestore%04d", n)
			t0 := time.Now()
			sb, err := v.e.Restore(ctx, engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 256, Hostname: "bench"}, v.img)
			if err != nil {
				b.Fatalf("%s: restore: %v", v.name, err)
			}
			p, err := sb.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"true"}})
			if err == nil {
				_, err = p.Wait(ctx)
			}
			v.times = append(v.times, time.Since(t0))
			if err != nil {
				b.Fatalf("%s: exec: %v", v.name, err)
			}
			b.StopTimer()
			if err := v.e.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	for _, v := range vs {
		slices.Sort(v.times)
		b.ReportMetric(float64(v.times[len(v.times)/2].Microseconds())/1000, v.name+"-p50-ms")
	}
	for name, img := range imgs {
		var size int64
		_ = filepath.Walk(img, func(_ string, fi os.FileInfo, _ error) error {
			if fi != nil && !fi.IsDir() {
				size += fi.Size()
			}
			return nil
		})
		b.ReportMetric(float64(size>>20), name+"-image-MiB")
	}
}

// BenchmarkCreateWithVolume: create (to a ready agent) and destroy a
// sandbox with a bind mount at a directory the image has (the image root
// itself: "root-ms") and at a path it lacks (a root view, an overlay
// mounted for the start: "view-ms"), alternating in each round so both
// see the same load; medians are reported.
func BenchmarkCreateWithVolume(b *testing.B) {
	images := testenv.ImagesDir(b)
	_, agentBin := testenv.Binaries(b)
	dir := testenv.TempDir(b)
	e, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "state"), Runsc: testenv.Runsc(b), AgentPath: agentBin})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	src := filepath.Join(dir, "vol")
	if err := os.Mkdir(src, 0o755); err != nil {
		b.Fatal(err)
	}
	var took [2][]float64
	n := 0
	for b.Loop() {
		for i, dst := range []string{"/mnt", "/clade-bench-missing"} {
			n++
			id := fmt.Sprintf("benchvol%08d", n)
			t0 := time.Now()
			sb, err := e.Create(context.Background(), engine.Spec{ID: id, RootFS: filepath.Join(images, "default", "rootfs"), MemoryMiB: 128, Hostname: "v",
				Mounts: []engine.Mount{{Source: src, Destination: dst}}})
			if err != nil {
				b.Fatal(err)
			}
			if err := e.Destroy(context.Background(), sb.ID()); err != nil {
				b.Fatal(err)
			}
			took[i] = append(took[i], float64(time.Since(t0).Microseconds())/1000)
		}
	}
	for i, name := range []string{"root-ms", "view-ms"} {
		slices.Sort(took[i])
		b.ReportMetric(took[i][len(took[i])/2], name)
	}
}
