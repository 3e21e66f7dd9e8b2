package bench

import (
	"context"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// BenchmarkTemplateCreate compares, in one run, a create that boots the
// image with one that restores a template's ready snapshot (its start
// command already running), each until the sandbox answers an exec.
func BenchmarkTemplateCreate(b *testing.B) {
	d := testenv.StartDaemon(b, "--warm-pool", "4")
	c := d.Client
	ctx := context.Background()
	img, err := c.Build(ctx, sdk.BuildRequest{Name: "bench-tmpl", From: "default",
		Start: "python3 -m http.server 8080 --bind 127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeleteImage(context.Background(), img.Name) })
	// warm: the pool holds 2 prepared sandboxes for default creates, and
	// after the first template create also 1 of the template's shape.
	for _, tc := range []struct {
		name, image string
		warm        int
	}{{"boot", "default", 2}, {"template", img.Name, 3}} {
		b.Run(tc.name, func(b *testing.B) {
			var samples []time.Duration
			for b.Loop() {
				start := time.Now()
				sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Image: tc.image})
				if err != nil {
					b.Fatal(err)
				}
				if st, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || st.Code != 0 {
					b.Fatal(err, st)
				}
				samples = append(samples, time.Since(start))
				b.StopTimer()
				_ = c.DeleteSandbox(ctx, sb.ID)
				waitWarm(b, c, tc.warm)
				b.StartTimer()
			}
			report(b, samples)
		})
	}
}
