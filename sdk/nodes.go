package sdk

import (
	"context"
	"net/http"

	"github.com/clade-sandbox/clade/api"
)

// Node and NodeCapacity are a cluster's nodes (see api).
type (
	Node         = api.Node
	NodeCapacity = api.NodeCapacity
)

// ListNodes lists the live nodes of the daemon's cluster, by name. A
// daemon outside a cluster refuses with InvalidArgument.
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var ns []Node
	return ns, c.call(ctx, http.MethodGet, "/v1/nodes", nil, &ns)
}
