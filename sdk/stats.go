package sdk

import (
	"context"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

// SandboxStats is one reading of a sandbox's resource use.
type SandboxStats = api.SandboxStats

// Stats reads a sandbox's CPU time, memory and process count now. A
// sandbox that is not running has no use to read: the reading has only its
// id and state. Reading never wakes a sleeping sandbox. An unknown sandbox
// gives an error for which IsNotFound is true.
func (c *Client) Stats(ctx context.Context, ref string) (SandboxStats, error) {
	var st SandboxStats
	return st, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/stats", nil, &st)
}

// StatsList reads the sandboxes named by refs (ids or names), in that
// order, or every sandbox when refs is empty.
func (c *Client) StatsList(ctx context.Context, refs ...string) ([]SandboxStats, error) {
	q := url.Values{}
	for _, r := range refs {
		q.Add("id", r)
	}
	path := "/v1/stats"
	if len(refs) > 0 {
		path += "?" + q.Encode()
	}
	var sts []SandboxStats
	return sts, c.call(ctx, http.MethodGet, path, nil, &sts)
}

// CPUPercent is the CPU use between two readings of one sandbox, in
// percent of one core (200 is two cores busy), or 0 when it cannot tell
// (a reading without use, a restart between them).
func CPUPercent(prev, cur SandboxStats) float64 {
	dt := cur.ReadAt.Sub(prev.ReadAt)
	if dt <= 0 || cur.CPUNanos < prev.CPUNanos || prev.CPUNanos == 0 {
		return 0
	}
	return float64(cur.CPUNanos-prev.CPUNanos) / float64(dt.Nanoseconds()) * 100
}
