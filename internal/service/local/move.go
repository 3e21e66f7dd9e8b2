package local

import (
	"context"
	"io"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/service"
)

var (
	_ service.Mover   = (*Service)(nil)
	_ service.Drainer = (*Service)(nil)
)

// SleepImage is the digest of sleeping sandbox id's image in the snapshot
// store.
func (s *Service) SleepImage(ctx context.Context, id string) (string, error) {
	d, err := sandbox.NewMover(s.mgr).SleepImage(ctx, id)
	return string(d), err
}

// Adopt makes sandbox id here, asleep, from its image in the snapshot
// store, on the image root it stands on (fetched with fetchRoot if this node
// lacks it).
func (s *Service) Adopt(ctx context.Context, id, digest string, fetchRoot func(ctx context.Context, root string) (io.ReadCloser, error)) (api.Sandbox, error) {
	return s.one(sandbox.NewMover(s.mgr).Adopt(ctx, id, digest, fetchRoot))
}

// Disown removes this node's copy of a sandbox the cluster moved away,
// keeping its copy in the snapshot store.
func (s *Service) Disown(ctx context.Context, id string) error {
	return sandbox.NewMover(s.mgr).Disown(ctx, id)
}

// SleepIdle puts running sandbox id to sleep for a drain when it is idle.
func (s *Service) SleepIdle(ctx context.Context, id string) (string, error) {
	return sandbox.NewMover(s.mgr).SleepIdle(ctx, id)
}
