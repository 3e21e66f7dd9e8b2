package gvisor_test

import (
	"context"
	"io"
	"path/filepath"
	"testing"

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
