package cluster

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
)

// TestLeaseOutlivesSlowCapacity: a capacity read that blocks for longer
// than the lease's TTL (a loaded host: MemAvailable, the local service's
// counts) does not let the live node's lease lapse: its key stays all
// along, and the refresh that the read finally answers writes the new
// capacity under the same lease.
func TestLeaseOutlivesSlowCapacity(t *testing.T) {
	cli := startEtcd(t)
	const ttl = 2 * time.Second
	var calls atomic.Int32
	blocked, release := make(chan struct{}), make(chan struct{})
	capacity := func(context.Context) (api.NodeCapacity, error) {
		switch calls.Add(1) {
		case 1: // the join's
			return api.NodeCapacity{Cores: 1}, nil
		case 2: // the first refresh's: slow, whatever its context says
			close(blocked)
			<-release
		}
		return api.NodeCapacity{Cores: 7}, nil
	}
	c, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:1", LeaseTTL: ttl, Refresh: 200 * time.Millisecond, Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
		c.Close()
	}()
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	w := cli.Watch(t.Context(), nodeKey("a"))
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("no capacity refresh within 30s")
	}

	// Three TTLs with the capacity read blocked: before the keepalive had
	// a loop of its own, the lease lapsed within one and the key went.
	window := time.After(3 * ttl)
	for open := true; open; {
		select {
		case resp := <-w:
			if resp.Canceled {
				t.Fatalf("watch ended: %v", resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					t.Fatalf("node a's key went while its capacity read was blocked (lease TTL %v): the keepalive waited for it", ttl)
				}
			}
		case <-window:
			open = false
		}
	}
	ttlResp, err := cli.TimeToLive(t.Context(), lease)
	if err != nil || ttlResp.TTL <= 0 {
		t.Fatalf("lease %x after the blocked read: ttl %+v, err %v", int64(lease), ttlResp, err)
	}
	ns, err := c.Nodes(t.Context())
	if err != nil || len(ns) != 1 || ns[0].Name != "a" || ns[0].Capacity.Cores != 1 {
		t.Fatalf("nodes while the read is blocked: %+v, %v (want a, with the join's capacity)", ns, err)
	}

	// The read answers: its capacity is written, under the same lease.
	close(release)
	released = true
	deadline := time.After(30 * time.Second)
	for {
		select {
		case resp := <-w:
			if resp.Canceled {
				t.Fatalf("watch ended: %v", resp.Err())
			}
			for _, ev := range resp.Events {
				var n api.Node
				if ev.Type != mvccpb.PUT || json.Unmarshal(ev.Kv.Value, &n) != nil || n.Capacity.Cores != 7 {
					continue
				}
				if clientv3.LeaseID(ev.Kv.Lease) != lease {
					t.Fatalf("the capacity was written under lease %x, want %x (the node's lease was taken again)", ev.Kv.Lease, int64(lease))
				}
				return
			}
		case <-deadline:
			t.Fatal("the capacity read after the blocked one was not written within 30s")
		}
	}
}

// TestNodeKeyTakenBack: a node whose key went while its lease lives (a
// capacity write finds the key not its lease's) registers again, under a
// new lease, and says so on rejoined (its sandboxes are checked).
func TestNodeKeyTakenBack(t *testing.T) {
	cli := startEtcd(t)
	c, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:1", LeaseTTL: 2 * time.Second, Refresh: 200 * time.Millisecond,
		Capacity: func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{Cores: 3}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.mu.Lock()
	old := c.lease
	c.mu.Unlock()
	d, err := cli.Delete(t.Context(), nodeKey("a"))
	if err != nil || d.Deleted != 1 {
		t.Fatalf("delete node a's key: %+v, %v", d, err)
	}
	w := cli.Watch(t.Context(), nodeKey("a"), clientv3.WithRev(d.Header.Revision+1))
	deadline := time.After(30 * time.Second)
	for back := false; !back; {
		select {
		case resp := <-w:
			if resp.Canceled {
				t.Fatalf("watch ended: %v", resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.PUT {
					if clientv3.LeaseID(ev.Kv.Lease) == old {
						t.Fatalf("node a's key written again under its old lease %x, not taken back with a new one", int64(old))
					}
					back = true
				}
			}
		case <-deadline:
			t.Fatal("node a's key did not come back within 30s")
		}
	}
	select {
	case <-c.rejoined:
	case <-time.After(30 * time.Second):
		t.Fatal("no rejoined signal after the key was taken back")
	}
	if got := nodeNames(t, c); len(got) != 1 || got[0] != "a" {
		t.Fatalf("nodes %v, want [a]", got)
	}
}
