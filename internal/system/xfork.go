package system

import (
	"context"
	"encoding/json"
	"io"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/sandbox"
)

// porter adapts the lifecycle's sandbox.Porter to cluster.Porter: a fork
// across nodes (the cluster package reaches the node through interfaces
// only).
type porter struct{ p *sandbox.Porter }

var _ cluster.Porter = porter{}

func (p porter) Export(ctx context.Context, source string, n int) (cluster.SnapshotMeta, func(), error) {
	e, release, err := p.p.Export(ctx, source, n)
	if err != nil {
		return cluster.SnapshotMeta{}, nil, err
	}
	var m cluster.SnapshotMeta
	if err := convert(e, &m); err != nil {
		release()
		return cluster.SnapshotMeta{}, nil, err
	}
	return m, release, nil
}

func (p porter) Open(digest string) (string, func(), error) { return p.p.Open(digest) }

func (p porter) SendRoot(ctx context.Context, id string, w func() io.Writer) error {
	return p.p.SendRoot(ctx, id, w)
}

func (p porter) Import(ctx context.Context, meta cluster.SnapshotMeta, n int, fetch func(ctx context.Context, dir string) error,
	fetchRoot func(ctx context.Context, id string) (io.ReadCloser, error)) (api.ForkResult, error) {
	var e sandbox.Export
	if err := convert(meta, &e); err != nil {
		return api.ForkResult{}, err
	}
	res, err := p.p.Import(ctx, e, n, fetch, fetchRoot)
	if err != nil {
		return api.ForkResult{}, err
	}
	out := api.ForkResult{Snapshot: res.Snapshot, Children: make([]api.ForkChild, len(res.Children))}
	for i, c := range res.Children {
		out.Children[i] = api.ForkChild{ID: c.ID}
		if c.Err != nil {
			out.Children[i] = api.ForkChild{Error: c.Err.Error(), Code: string(errdefs.ClassOf(c.Err))}
		}
	}
	return out, nil
}

// convert copies one of the two mirror types into the other.
func convert(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}
