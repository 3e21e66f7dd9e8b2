package cluster

import (
	"testing"
	"time"
)

// TestEmbedLeaseTTLMin: the embedded member grants EmbedMinLeaseTTL as it
// is asked, and raises a shorter lease to it (etcd's 1.5 election
// timeouts), which is why the daemon refuses a shorter --cluster-lease-ttl
// with --cluster embed: a 2 s flag was accepted and the node's lease
// lapsed after 3 s.
func TestEmbedLeaseTTLMin(t *testing.T) {
	cli := startEtcd(t)
	min := int64(EmbedMinLeaseTTL / time.Second)
	for _, ask := range []int64{min, min - 1} {
		l, err := cli.Grant(t.Context(), ask)
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL != min {
			t.Errorf("a %d s lease granted with TTL %d s, want %d (EmbedMinLeaseTTL does not follow the election timeout)", ask, l.TTL, min)
		}
	}
}
