package sdk

import (
	"time"

	"github.com/clade-sandbox/clade/internal/deadpeer"
)

// DefaultDeadPeerTimeout is how long a TCP connection to a daemon may go
// with data the daemon has not acknowledged, or with its keepalive probes
// unanswered, before the client closes it and the call fails. Without it a
// daemon behind a cut link (a partitioned cluster node, a host that
// vanished) holds a call for the kernel's ~15 minutes of retransmissions.
// A daemon that is only slow to answer is not cut off: its kernel
// acknowledges what it receives.
const DefaultDeadPeerTimeout = deadpeer.Default

// WithDeadPeerTimeout sets the client's DefaultDeadPeerTimeout (TCP
// daemons only; 0 leaves the kernel's own).
func WithDeadPeerTimeout(d time.Duration) Option { return func(c *Client) { c.deadPeer = d } }
