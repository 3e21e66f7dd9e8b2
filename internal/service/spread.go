package service

import (
	"context"

	"github.com/clade-sandbox/clade/api"
)

// Spreader is a service that can place a fork's children across the
// nodes of a cluster (cluster.Service, and remote.Service forwarding to
// one). A front sends a fork that asks for the spread to it; a service
// without it (a node outside a cluster) refuses such a fork.
type Spreader interface {
	ForkAcross(ctx context.Context, req api.ForkRequest) (api.ForkResult, error)
}
