package api

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Positions is where a merged event stream (GET /v1/events?cluster=true)
// stands on each node: the seq of the last event of that node received
// (or, in the Clade-Events-Start header, the seq each node's part starts
// after). In a query (since=) and the header it is written
// NODE:SEQ,NODE:SEQ,... (String); a node not named replays every event it
// keeps.
type Positions map[string]uint64

// String is p as since= takes it, by node name.
func (p Positions) String() string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", n, p[n])
	}
	return b.String()
}

// maxPositions bounds the nodes a since= may name.
const maxPositions = 1024

// ParsePositions reads NODE:SEQ,NODE:SEQ,... (String's form). A node named
// twice, an empty name or a seq that is not a whole number is an error.
func ParsePositions(s string) (Positions, error) {
	p := Positions{}
	if s == "" {
		return p, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxPositions {
		return nil, fmt.Errorf("%d positions: at most %d", len(parts), maxPositions)
	}
	for _, part := range parts {
		node, seq, ok := strings.Cut(part, ":")
		if !ok || node == "" {
			return nil, fmt.Errorf("%.80q is not NODE:SEQ", part)
		}
		n, err := strconv.ParseUint(seq, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%.80q: the seq is not a whole number", part)
		}
		if _, dup := p[node]; dup {
			return nil, fmt.Errorf("node %.80q is named twice", node)
		}
		p[node] = n
	}
	return p, nil
}
