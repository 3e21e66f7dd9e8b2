package cluster

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/events"
)

// joinBus joins node name with an event bus of its own (Config.Events).
func joinBus(t *testing.T, cli *clientv3.Client, name string) (*Cluster, *events.Bus) {
	t.Helper()
	bus := events.New(0)
	c, err := Join(t.Context(), cli, Config{Node: name, Addr: "127.0.0.1:1", LeaseTTL: 2 * time.Second, Events: bus,
		Capacity: func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{Cores: 2}, nil }})
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	t.Cleanup(c.Close)
	return c, bus
}

// TestLostEvents: node a holds a running sandbox (named, labelled), a
// sleeping one and a fork's child it imports; a is SIGKILLed. Once its
// lease lapsed, b and c mark what it held at once: exactly one `lost`
// event in all, on the bus of the node whose mark won, with the
// sandbox's id, name, labels and the reason; none for the sleeping one
// (it keeps its record) or the importing child (its record is removed:
// never a sandbox). A second pass says nothing again.
func TestLostEvents(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	b, bbus := joinBus(t, cli, "b")
	c, cbus := joinBus(t, cli, "c")
	release, err := a.ReserveName(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"team": "rl"}
	if err := a.PublishImage(ctx, api.Sandbox{ID: "sbrun", Name: "web", State: "running", Image: "default", Labels: labels}, ""); err != nil {
		t.Fatal(err)
	}
	release()
	if err := a.PublishImage(ctx, api.Sandbox{ID: "sbsleep", State: "sleeping", Image: "default"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := a.PublishImporting(ctx, []string{"sbimp"}, api.SnapshotExport{Image: "default", MemoryMiB: 256, CPUs: 1}); err != nil {
		t.Fatal(err)
	}
	a.abandon()
	waitGone(t, b, "a")

	var wg sync.WaitGroup
	for _, n := range []*Cluster{b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.MarkLost(ctx); err != nil {
				t.Errorf("%s: mark lost: %v", n.cfg.Node, err)
			}
		}()
	}
	wg.Wait()
	var lost []events.Event
	for _, bus := range []*events.Bus{bbus, cbus} {
		evs, err := bus.Since(0, events.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, evs...)
	}
	if len(lost) != 1 {
		t.Fatalf("events on b's and c's buses: %v, want one lost event", lost)
	}
	e := lost[0]
	if e.Type != events.Lost || e.Sandbox != "sbrun" || e.Name != "web" || e.Labels["team"] != "rl" ||
		!strings.Contains(e.Reason, "node a left the cluster") || !strings.Contains(e.Reason, "running") {
		t.Fatalf("the lost event: %+v", e)
	}
	rec, ok, err := b.Lookup(ctx, "sbrun")
	if err != nil || !ok || rec.State != StateLost || rec.Reason != e.Reason {
		t.Fatalf("the lost record: %+v %v %v (event's reason %q)", rec, ok, err, e.Reason)
	}
	// Again, the directory read afresh (not skipped): nothing new.
	for _, n := range []*Cluster{b, c} {
		if _, err := n.markLost(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, bus := range []*events.Bus{bbus, cbus} {
		if evs, _ := bus.Since(0, events.Filter{}); len(evs) > 1 || len(evs) == 1 && evs[0].Seq != e.Seq {
			t.Fatalf("a second pass published %v", evs)
		}
	}
	if _, ok, _ := b.Lookup(ctx, "sbimp"); ok {
		t.Fatal("the importing record of gone node a is still there")
	}
}

// lossyKV applies every transaction but answers the first one that puts
// a sandbox's record with an error, as a call whose answer was lost (a
// timeout, a member gone mid-call) does.
type lossyKV struct {
	clientv3.KV
	armed atomic.Bool
}

func (k *lossyKV) Txn(ctx context.Context) clientv3.Txn { return &lossyTxn{Txn: k.KV.Txn(ctx), kv: k} }

type lossyTxn struct {
	clientv3.Txn
	kv  *lossyKV
	put bool
}

func (t *lossyTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *lossyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *lossyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), sandboxesPrefix()) {
			t.put = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *lossyTxn) Commit() (*clientv3.TxnResponse, error) {
	r, err := t.Txn.Commit()
	if err == nil && t.put && t.kv.armed.CompareAndSwap(true, false) {
		return nil, context.DeadlineExceeded
	}
	return r, err
}

// TestLostEventAnswerLost: a mark whose transaction etcd applied but whose
// answer was lost still says its `lost` event (no later pass marks a lost
// record again, so it was that mark's or nobody's), and the pass goes on.
func TestLostEventAnswerLost(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	if err := a.PublishImage(ctx, api.Sandbox{ID: "sbrun", State: "running", Image: "default"}, ""); err != nil {
		t.Fatal(err)
	}
	bcli, err := Dial(ctx, cli.Endpoints(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bcli.Close() })
	lossy := &lossyKV{KV: bcli.KV}
	bcli.KV = lossy
	b, bbus := joinBus(t, bcli, "b")
	a.abandon()
	waitGone(t, b, "a")

	lossy.armed.Store(true)
	if _, err := b.MarkLost(ctx); err != nil {
		t.Fatalf("mark lost, its answer lost: %v", err)
	}
	if lossy.armed.Load() {
		t.Fatal("the mark's answer was not lost: the test did not test it")
	}
	rec, ok, err := b.Lookup(ctx, "sbrun")
	if err != nil || !ok || rec.State != StateLost {
		t.Fatalf("record after the mark: %+v %v %v, want lost", rec, ok, err)
	}
	evs, err := bbus.Since(0, events.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Type != events.Lost || evs[0].Sandbox != "sbrun" {
		t.Fatalf("events on b's bus: %+v, want one lost event of sbrun", evs)
	}
}
