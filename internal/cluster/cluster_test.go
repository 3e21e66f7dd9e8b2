package cluster

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startEtcd runs a one-member etcd in the test process and returns a
// client of it.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	e, err := StartEmbed(t.Context(), Embed{Name: "test", Dir: filepath.Join(t.TempDir(), "etcd"), Client: freeAddr(t), Peer: freeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := Dial(t.Context(), e.Endpoints, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func join(t *testing.T, cli *clientv3.Client, name, leaseFile string) *Cluster {
	t.Helper()
	c, err := Join(t.Context(), cli, Config{Node: name, Addr: "127.0.0.1:1", LeaseTTL: 2 * time.Second, LeaseFile: leaseFile,
		Capacity: func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{Cores: 2, Sandboxes: 1}, nil }})
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	return c
}

// abandon stops refreshing without revoking the lease, as a node killed
// with SIGKILL does.
func (c *Cluster) abandon() {
	close(c.stop)
	<-c.done
}

func nodeNames(t *testing.T, c *Cluster) []string {
	t.Helper()
	ns, err := c.Nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range ns {
		names = append(names, n.Name)
	}
	return names
}

// TestNodeLeaseLapses: a node that stops refreshing (killed) disappears
// from the cluster once its lease lapses, and one that closes leaves at
// once.
func TestNodeLeaseLapses(t *testing.T) {
	cli := startEtcd(t)
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	c := join(t, cli, "c", "")
	if got := nodeNames(t, a); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("nodes %v, want [a b c]", got)
	}
	ns, _ := a.Nodes(t.Context())
	if !ns[0].Self || ns[1].Self || ns[0].Capacity.Cores != 2 || ns[0].Addr != "127.0.0.1:1" || ns[0].JoinedAt.IsZero() {
		t.Fatalf("node a as listed: %+v", ns[0])
	}
	// Refreshes move refreshed_at on.
	first := ns[1].RefreshedAt
	w := cli.Watch(t.Context(), nodeKey("b"))
	select {
	case <-w:
	case <-time.After(5 * time.Second):
		t.Fatal("node b's key was not refreshed within 5s")
	}
	ns, _ = a.Nodes(t.Context())
	if !ns[1].RefreshedAt.After(first) {
		t.Fatalf("b's refreshed_at %v did not move on from %v", ns[1].RefreshedAt, first)
	}

	c.Close()
	if got := nodeNames(t, a); len(got) != 2 {
		t.Fatalf("after c closed, nodes %v, want [a b]", got)
	}

	start := time.Now()
	wctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	w = cli.Watch(wctx, nodeKey("b"))
	b.abandon()
	for gone := false; !gone; {
		select {
		case resp := <-w:
			for _, ev := range resp.Events {
				gone = gone || ev.Type == mvccpb.DELETE
			}
			if resp.Canceled {
				t.Fatalf("watch ended: %v", resp.Err())
			}
		case <-wctx.Done():
			t.Fatal("node b's key outlived its lease by far")
		}
	}
	t.Logf("an abandoned node's key went after %v (lease TTL 2s)", time.Since(start).Round(time.Millisecond))
	if got := nodeNames(t, a); len(got) != 1 || got[0] != "a" {
		t.Fatalf("after b's lease lapsed, nodes %v, want [a]", got)
	}
}

// TestNodeNameTaken: a second live node of one name is refused; the same
// node restarted with its lease file takes its name back at once.
func TestNodeNameTaken(t *testing.T) {
	cli := startEtcd(t)
	lf := filepath.Join(t.TempDir(), "lease")
	a := join(t, cli, "a", lf)
	if _, err := os.Stat(lf); err != nil {
		t.Fatalf("lease file: %v", err)
	}
	_, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:2", LeaseTTL: 2 * time.Second})
	if err == nil {
		t.Fatal("a second live node a was let in")
	}
	t.Logf("refused: %v", err)
	// Killed, then restarted on its data dir: back at once.
	a.abandon()
	start := time.Now()
	a2 := join(t, cli, "a", lf)
	defer a2.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the restarted node took %v to take its name back", d)
	}
	if got := nodeNames(t, a2); len(got) != 1 {
		t.Fatalf("nodes %v", got)
	}
	for _, bad := range []string{"", "a b", "a/b", string(make([]byte, 64))} {
		if _, err := Join(t.Context(), cli, Config{Node: bad, Addr: "x:1"}); err == nil {
			t.Errorf("node name %q accepted", bad)
		}
	}
}

// TestDirectory: records and names are written with compare-and-swap; a
// name is unique across nodes; a node never writes over another's record.
func TestDirectory(t *testing.T) {
	cli := startEtcd(t)
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	ctx := t.Context()

	release, err := a.ReserveName(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReserveName(ctx, "web"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("b reserved a name a's create holds: %v", err)
	}
	sb := api.Sandbox{ID: "sb1", Name: "web", State: "running", Env: []string{"SECRET=1"}, Ingress: &api.Ingress{TrafficToken: "tok"}}
	if err := a.Publish(ctx, sb); err != nil {
		t.Fatal(err)
	}
	release() // after Publish: leaves the name to the sandbox
	_, err = b.ReserveName(ctx, "web")
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("b reserved the name of a's sandbox: %v", err)
	}
	t.Logf("refused: %v", err)
	for _, ref := range []string{"sb1", "web"} {
		rec, ok, err := b.Lookup(ctx, ref)
		if err != nil || !ok || rec.Node != "a" || rec.ID != "sb1" || rec.State != "running" || rec.Epoch != 1 {
			t.Fatalf("lookup %s from b: %+v %v %v", ref, rec, ok, err)
		}
		if rec.Sandbox.Env != nil || rec.Sandbox.Ingress != nil {
			t.Fatalf("the directory holds what stays on the node: %+v", rec.Sandbox)
		}
	}
	// b may not write over a's record, nor remove it.
	if err := b.Publish(ctx, api.Sandbox{ID: "sb1", State: "sleeping"}); !errors.Is(err, errNotHolder) {
		t.Fatalf("b wrote over a's record: %v", err)
	}
	if err := b.Unpublish(ctx, "sb1", false); !errors.Is(err, errNotHolder) {
		t.Fatalf("b removed a's record: %v", err)
	}
	// A state change by the holder.
	sb.State = "sleeping"
	if err := a.Publish(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := b.Lookup(ctx, "web"); rec.State != "sleeping" {
		t.Fatalf("state after the change: %+v", rec)
	}
	// A name already another's is not taken by a second sandbox.
	if err := b.Publish(ctx, api.Sandbox{ID: "sb2", Name: "web", State: "running"}); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := b.Lookup(ctx, "web"); rec.ID != "sb1" {
		t.Fatalf("web now names %s", rec.ID)
	}
	if rec, _, _ := b.Lookup(ctx, "sb2"); rec.Name != "" || rec.Node != "b" {
		t.Fatalf("sb2's record: %+v", rec)
	}
	recs, err := a.Records(ctx)
	if err != nil || len(recs) != 2 {
		t.Fatalf("records %+v %v", recs, err)
	}
	// Removed: the name is free again.
	if err := a.Unpublish(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.Lookup(ctx, "web"); ok {
		t.Fatal("web still found after its sandbox's record went")
	}
	rel, err := b.ReserveName(ctx, "web")
	if err != nil {
		t.Fatalf("b could not take the freed name: %v", err)
	}
	rel()
	// A reservation dropped by a create that failed frees the name.
	if _, err := a.ReserveName(ctx, "web"); err != nil {
		t.Fatalf("the released reservation still holds the name: %v", err)
	}
}

// TestConcurrentNames: creates of one name on two nodes at once: exactly
// one gets it.
func TestConcurrentNames(t *testing.T) {
	cli := startEtcd(t)
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	for i := range 20 {
		name := "n" + string(rune('a'+i))
		errs := make(chan error, 2)
		for _, c := range []*Cluster{a, b} {
			go func() { _, err := c.ReserveName(t.Context(), name); errs <- err }()
		}
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("name %s: %v and %v; want exactly one refused", name, e1, e2)
		}
	}
}
