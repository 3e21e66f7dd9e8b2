package local_test

import (
	"context"
	"io"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/service"
)

// BenchmarkExecHot is an exec on a running sandbox through the local
// service, as a front makes it: validation, the lookup (GuestWaking), the
// agent call and its exit. The fake engine's stand-in agent ends each call
// at once, so what is measured is the host's path, no process start.
func BenchmarkExecHot(b *testing.B) {
	svc := newLocal(b)
	sb, err := svc.Create(b.Context(), api.CreateSandboxRequest{Image: "test", MemoryMiB: 128})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := api.ExecRequest{Cmd: []string{"true"}}
	for b.Loop() {
		p, err := svc.Exec(ctx, sb.ID, service.Wake, req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, p.Stdout())
		if _, err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		p.Close()
	}
}
