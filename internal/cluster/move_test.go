package cluster

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
)

// waitGone waits until node name's key is gone (its lease lapsed).
func waitGone(t *testing.T, c *Cluster, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, live, err := c.node(t.Context(), name)
		if err == nil && !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s's key outlived its lease by far (%v)", name, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond): // polling a lease's lapse
		}
	}
}

// TestMoveClaims: the directory's side of a move, against a real etcd. A
// sleeping record names its image; it is given to another node only while
// its node is gone, and of two nodes giving it at once one wins; the
// node it is given to claims it (bound to its lease) once, a second
// claim fails; a claim whose node died lapses, and MarkLost leaves such a
// record alone; the old node, back, is fenced; a failed move's claim is
// given back.
func TestMoveClaims(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	b := join(t, cli, "b", "")
	c := join(t, cli, "c", "")
	const img = "sha256:0123456789012345678901234567890123456789012345678901234567890123"
	sb := api.Sandbox{ID: "sbm", State: "sleeping", Image: "default", MemoryMiB: 256}
	if err := a.PublishImage(ctx, sb, img); err != nil {
		t.Fatal(err)
	}
	rec, rev, claimed, ok, err := b.lookupRev(ctx, "sbm")
	if err != nil || !ok || claimed || rec.SleepImage != img || !movable(rec) || rec.Epoch != 1 {
		t.Fatalf("the sleeping record: %+v claimed=%v ok=%v %v", rec, claimed, ok, err)
	}
	// Its node is alive: not given away behind its back.
	if _, err := b.Reassign(ctx, rec, rev, "b", true); !errors.Is(err, errMoveRace) {
		t.Fatalf("a record of a live node given away: %v", err)
	}

	a.abandon() // SIGKILLed
	waitGone(t, b, "a")
	// b and c give it away at once, each to itself: one wins.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, n := range []*Cluster{b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.Reassign(ctx, rec, rev, n.cfg.Node, true)
		}()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two reassigns at one revision: %v, %v (want exactly one to win)", errs[0], errs[1])
	}
	winner, loser := b, c
	if errs[1] == nil {
		winner, loser = c, b
	}
	defer loser.Close() // the winner dies below
	rec, rev, _, _, err = loser.lookupRev(ctx, "sbm")
	if err != nil || rec.Node != winner.cfg.Node || rec.Epoch != 2 || rec.State != "sleeping" {
		t.Fatalf("after the reassign: %+v %v", rec, err)
	}
	// The loser may not claim what names the winner; the winner claims it
	// once.
	claimRev, err := winner.claim(ctx, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := winner.claim(ctx, rec, rev); !errors.Is(err, errMoveRace) {
		t.Fatalf("a second claim at the same revision: %v", err)
	}
	moving, mrev, claimed, _, _ := loser.lookupRev(ctx, "sbm")
	if moving.State != StateMoving || !claimed || moving.Node != winner.cfg.Node || moving.Epoch != 2 || winner.epoch("sbm") != 2 {
		t.Fatalf("the claimed record: %+v claimed=%v, winner knows epoch %d", moving, claimed, winner.epoch("sbm"))
	}
	if _, err := loser.claim(ctx, moving, mrev); !errors.Is(err, errMoveRace) {
		t.Fatalf("a claim over a live claim: %v", err)
	}
	// A failed adopt gives it back: sleeping on the winner, same epoch.
	if err := winner.unclaim(ctx, rec, claimRev); err != nil {
		t.Fatal(err)
	}
	back, brev, claimed, _, _ := loser.lookupRev(ctx, "sbm")
	if back.State != "sleeping" || claimed || back.Node != winner.cfg.Node || back.Epoch != 2 || back.SleepImage != img {
		t.Fatalf("given back: %+v claimed=%v", back, claimed)
	}
	// Claimed again, and the winner dies mid-move: the claim lapses, the
	// record is not marked lost.
	if _, err := winner.claim(ctx, back, brev); err != nil {
		t.Fatal(err)
	}
	winner.abandon()
	waitGone(t, loser, winner.cfg.Node)
	if _, err := loser.MarkLost(ctx); err != nil {
		t.Fatal(err)
	}
	left, lrev, claimed, _, _ := loser.lookupRev(ctx, "sbm")
	if left.State != StateMoving || claimed {
		t.Fatalf("a dead node's move: %+v claimed=%v (want moving, its claim lapsed, not lost)", left, claimed)
	}
	// The lapsed claim is taken by the loser (as routeSleeping does: the
	// record given to it first).
	left.State = "sleeping"
	mine, err := loser.Reassign(ctx, left, lrev, loser.cfg.Node, true)
	if err != nil || mine.Epoch != 3 {
		t.Fatalf("take a lapsed claim: %+v %v", mine, err)
	}
	// a comes back (a restart: it knows no epoch): its copy is fenced.
	a2 := join(t, cli, "a", "")
	defer a2.Close()
	if err := a2.PublishImage(ctx, sb, img); !errors.Is(err, errFenced) {
		t.Fatalf("the old node's write of a moved sandbox: %v (want fenced)", err)
	}
	if err := a2.Publish(ctx, api.Sandbox{ID: "sbm"}); !errors.Is(err, errFenced) {
		t.Fatalf("write of a moved record: %v", err)
	}
	// A record another node holds at epoch 1 (never moved) is not fenced:
	// the node is not its holder, nothing more.
	other := api.Sandbox{ID: "sbo", State: "running"}
	if err := loser.Publish(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := a2.Publish(ctx, other); !errors.Is(err, errNotHolder) {
		t.Fatalf("write of another node's record at epoch 1: %v (want not the holder)", err)
	}
}

// TestMovedNameFreed: a named sandbox moved to another node (given, claimed,
// published there) and then removed there frees its name: the name's key
// follows the sandbox to its new node, and the remove drops it.
func TestMovedNameFreed(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	const img = "sha256:0123456789012345678901234567890123456789012345678901234567890123"
	release, err := a.ReserveName(ctx, "foo")
	if err != nil {
		t.Fatal(err)
	}
	sb := api.Sandbox{ID: "sbn", Name: "foo", State: "sleeping", Image: "default", MemoryMiB: 256}
	if err := a.PublishImage(ctx, sb, img); err != nil {
		t.Fatal(err)
	}
	release()
	// a drained: the record is given to b, which adopts it.
	rec, rev, _, _, err := b.lookupRev(ctx, "sbn")
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = b.Reassign(ctx, rec, rev, "b", false); err != nil {
		t.Fatal(err)
	}
	_, rev, _, _, _ = b.lookupRev(ctx, "sbn")
	if _, err := b.claim(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, sb); err != nil {
		t.Fatal(err)
	}
	b.dropClaim(ctx, "sbn")
	if _, err := b.ReserveName(ctx, "foo"); err == nil || !strings.Contains(err.Error(), "node b") {
		t.Fatalf("the moved sandbox's name, taken again: %v (want refused, naming node b)", err)
	}
	// Removed on b: the name is free.
	if err := b.Unpublish(ctx, "sbn", false); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := a.Lookup(ctx, "foo"); ok || err != nil {
		t.Fatalf("the removed sandbox found by its name: %v %v", ok, err)
	}
	rel, err := a.ReserveName(ctx, "foo")
	if err != nil {
		t.Fatalf("the name of a moved sandbox removed on its new node is still taken: %v", err)
	}
	rel()
}
