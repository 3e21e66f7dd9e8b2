package sdk

import (
	"context"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

// Node and NodeCapacity are a cluster's nodes (see api).
type (
	Node          = api.Node
	NodeCapacity  = api.NodeCapacity
	DrainProgress = api.DrainProgress
	DrainHold     = api.DrainHold
)

// ListNodes lists the live nodes of the daemon's cluster, by name. A
// daemon outside a cluster refuses with InvalidArgument.
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var ns []Node
	return ns, c.call(ctx, http.MethodGet, "/v1/nodes", nil, &ns)
}

// DrainNode stops placing creates on the named node (it shows draining
// in ListNodes) until UndrainNode.
func (c *Client) DrainNode(ctx context.Context, name string) (Node, error) {
	var n Node
	return n, c.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/drain", nil, &n)
}

// UndrainNode lets placement pick the named node again.
func (c *Client) UndrainNode(ctx context.Context, name string) (Node, error) {
	var n Node
	return n, c.call(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(name)+"/drain", nil, &n)
}
