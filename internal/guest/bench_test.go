package guest_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"testing"

	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// BenchmarkLoopback runs the real agent in this process over a unix socket:
// the protocol's own cost (frames, flow control, tar) with no sandbox in
// the way. Profile it with -cpuprofile.
func BenchmarkLoopback(b *testing.B) {
	g := agentConn(b)
	ctx := context.Background()
	b.Run("exec-not-found", func(b *testing.B) {
		for b.Loop() {
			p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"no-such-command-xyz"}})
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, p.Stdout)
			_, _ = io.Copy(io.Discard, p.Stderr)
			if st, err := p.Wait(ctx); err != nil || st.Code != 127 {
				b.Fatalf("%+v %v", st, err)
			}
		}
	})
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := g.Ping(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	dir := b.TempDir()
	const size = 256 << 20
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	b.Run("push-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			err := g.CopyIn(ctx, dir, tarx.Stream(func(tw *tar.Writer) error {
				if err := tw.WriteHeader(&tar.Header{Name: "large.bin", Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
					return err
				}
				for left := size; left > 0; left -= len(chunk) {
					if _, err := tw.Write(chunk); err != nil {
						return err
					}
				}
				return nil
			}))
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pull-256MiB", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			rc, err := g.CopyOut(ctx, dir+"/large.bin", nil)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n < size {
				b.Fatalf("%d %v", n, err)
			}
		}
	})
	const files = 2000
	b.Run("push-files", func(b *testing.B) {
		for b.Loop() {
			err := g.CopyIn(ctx, dir, tarx.Stream(func(tw *tar.Writer) error {
				if err := tw.WriteHeader(&tar.Header{Name: "small/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
					return err
				}
				for i := range files {
					if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("small/f%05d", i), Mode: 0o644, Size: 4096, Typeflag: tar.TypeReg}); err != nil {
						return err
					}
					if _, err := tw.Write(chunk[:4096]); err != nil {
						return err
					}
				}
				return nil
			}))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(files*b.N)/b.Elapsed().Seconds(), "files/s")
	})
	b.Run("pull-files", func(b *testing.B) {
		for b.Loop() {
			rc, err := g.CopyOut(ctx, dir+"/small", nil)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n < files*4096 {
				b.Fatalf("%d %v", n, err)
			}
		}
		b.ReportMetric(float64(files*b.N)/b.Elapsed().Seconds(), "files/s")
	})
}
