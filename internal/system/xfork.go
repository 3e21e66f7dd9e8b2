package system

import (
	"context"
	"io"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/service/local"
)

// porter adapts the lifecycle's sandbox.Porter to cluster.Porter: a fork
// across nodes (the cluster package reaches the node through interfaces
// only).
type porter struct{ p *sandbox.Porter }

var _ cluster.Porter = porter{}

func (p porter) Export(ctx context.Context, source string, n int) (api.SnapshotExport, func(), error) {
	return p.p.Export(ctx, source, n)
}

func (p porter) Open(digest string) (string, func(), error) { return p.p.Open(digest) }

func (p porter) SendRoot(ctx context.Context, id string, w func() io.Writer) error {
	return p.p.SendRoot(ctx, id, w)
}

func (p porter) Import(ctx context.Context, meta api.SnapshotExport, n int, fetch func(ctx context.Context, dir string) error,
	fetchRoot func(ctx context.Context, id string) (io.ReadCloser, error), reserve func(ids []string) error) (api.ForkResult, error) {
	res, err := p.p.ImportAs(ctx, meta, n, fetch, fetchRoot, reserve)
	if err != nil {
		return api.ForkResult{}, err
	}
	return local.ForkResult(res), nil
}
