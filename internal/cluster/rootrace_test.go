package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRootStoreRaces: the races of image roots in the object store (in
// S3, a real SeaweedFS, and in a directory store) between two nodes on
// one etcd: rootUploadRace, rootDropConditional, rootSweepDropsSum.
func TestRootStoreRaces(t *testing.T) {
	cli := startEtcd(t)
	for kind, store := range rootStores(t) {
		for name, race := range map[string]func(*testing.T, *clientv3.Client, func(*testing.T) storeRoots, string){
			"upload": rootUploadRace, "drop": rootDropConditional, "sweep": rootSweepDropsSum,
		} {
			t.Run(name+"/"+kind, func(t *testing.T) { race(t, cli, store, kind) })
		}
	}
}

// rootNode is one node of the root races: its membership (the digests
// and the lock in etcd) and its copies into the shared store, whose image
// root's stream is its own (a root pulled on each node apart is: its
// descriptor names the node's own pull).
type rootNode struct {
	c      *Cluster
	copies *snapstore.Copies
	stream []byte
	base   string
}

type storeRoots interface {
	snapstore.Store
	snapstore.RootStore
}

// rootStores is the shared store of each kind: a real S3 server
// (SeaweedFS) and a directory store.
// One S3 server for the whole test (started with it, at the first
// use), a bucket of its own for each use.
func rootStores(top *testing.T) map[string]func(t *testing.T) storeRoots {
	var once sync.Once
	var srv *weedtest.Server
	n := 0
	return map[string]func(t *testing.T) storeRoots{
		"s3": func(t *testing.T) storeRoots {
			once.Do(func() { srv = weedtest.Start(top) })
			n++
			s, err := snapstore.NewS3(t.Context(), srv.Config(fmt.Sprint("roots-", n)))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"dir": func(t *testing.T) storeRoots {
			s, err := snapstore.NewLocal(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

var nodeSeq atomic.Int32

func newRootNode(t *testing.T, cli *clientv3.Client, s storeRoots, name, id string) *rootNode {
	t.Helper()
	name = fmt.Sprint(name, "-", nodeSeq.Add(1)) // a name of its own on the shared etcd
	n := &rootNode{stream: bytes.Repeat([]byte("the root as node "+name+" sends it "), 20000), base: t.TempDir()}
	copies, err := snapstore.NewCopies(s, filepath.Join(n.base, "objects"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(copies.Close)
	copies.SetRoots(func(ctx context.Context, _, _ string) (string, func(context.Context, io.Writer) error, error) {
		return id, func(ctx context.Context, w io.Writer) error {
			_, err := w.Write(n.stream)
			return err
		}, nil
	})
	c, err := Join(t.Context(), cli, Config{Node: name, Addr: "127.0.0.1:1", LeaseTTL: 3 * time.Second,
		Log: slog.New(slog.DiscardHandler),
		Capacity: func(context.Context) (api.NodeCapacity, error) {
			return api.NodeCapacity{Cores: 2, Sandboxes: 1}, nil
		},
		StoreRoot: copies.OpenRoot, StoreRootBad: copies.DropBadRoot,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	copies.SetRootSums(c)
	n.c, n.copies = c, copies
	return n
}

// put copies a sleep image standing on the root (uploading the root
// unless the store holds it with its digest) and waits for it.
func (n *rootNode) put(t *testing.T, name string) error {
	n.copies.Put("sleep/"+name, storetest.MakeImage(t, filepath.Join(n.base, "img", name), 64<<10+len(name)))
	return n.copies.Wait(t.Context(), "sleep/"+name)
}

// putRacing starts n's put of name at another node's step and returns
// once that put is done or waits for the other node (its "root-lock-wait"
// step); done is closed when the put ends.
func (n *rootNode) putRacing(t *testing.T, name string) (done chan error) {
	done = make(chan error, 1)
	waiting := make(chan struct{})
	var once sync.Once
	n.copies.SetTestHook(func(step string) {
		if step == "root-lock-wait" {
			once.Do(func() { close(waiting) })
		}
	})
	go func() { done <- n.put(t, name) }()
	select {
	case <-waiting:
	case err := <-done:
		done <- err
	case <-t.Context().Done():
	}
	return done
}

// wakeReads reads root id from the store as a wake does (checked against
// the digest the cluster recorded): nil if the wake accepts it.
func wakeReads(t *testing.T, c *Cluster, id string) ([]byte, error) {
	rc, err := c.storeRoot(t.Context(), id)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func rootIDOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// rootUploadRace: two nodes upload one image root at once (both found
// it absent), each its own stream of it. Node a's object lands first; node
// b's upload (hook) runs at once after it, before a records its digest.
// Whatever the order, the digest recorded must be the one of the object
// that landed: the next wake from the store accepts it. It used to record
// a's digest over b's object, and the wake refused a good root and deleted
// it.
func rootUploadRace(t *testing.T, cli *clientv3.Client, store func(*testing.T) storeRoots, kind string) {
	s := store(t)
	id := rootIDOf("a raced upload " + kind)
	a, b := newRootNode(t, cli, s, "a-"+kind, id), newRootNode(t, cli, s, "b-"+kind, id)
	var bDone chan error
	a.copies.SetTestHook(func(step string) {
		if step == "root-uploaded" && bDone == nil {
			bDone = b.putRacing(t, "b1")
		}
	})
	if err := a.put(t, "a1"); err != nil {
		t.Fatal(err)
	}
	if bDone == nil {
		t.Fatal("node a's copy never reached root-uploaded")
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	got, err := wakeReads(t, a.c, id)
	if err != nil {
		t.Fatalf("the next wake from the store refuses the root two nodes uploaded at once: %v", err)
	}
	if !bytes.Equal(got, a.stream) && !bytes.Equal(got, b.stream) {
		t.Fatalf("the wake read %d bytes that neither node sent", len(got))
	}
	t.Logf("the store holds node %s's upload, and its digest", map[bool]string{true: "a", false: "b"}[bytes.Equal(got, a.stream)])
}

// rootDropConditional: a wake that shows the store's root bad deletes
// it only while it is still the object it read. Here a forged root is
// refused; right after the node rehashed it and before its delete (hook),
// another node's wake deletes it and a sleep uploads a good root: the
// good upload must stay (it used to be deleted, and the sandboxes on the
// root wake nowhere until the next sleep).
func rootDropConditional(t *testing.T, cli *clientv3.Client, store func(*testing.T) storeRoots, kind string) {
	s := store(t)
	id := rootIDOf("a root shown bad " + kind)
	a, b := newRootNode(t, cli, s, "a-"+kind, id), newRootNode(t, cli, s, "b-"+kind, id)
	if err := a.put(t, "a1"); err != nil {
		t.Fatal(err)
	}
	// Someone with write access to the bucket forges the root.
	forged := bytes.Repeat([]byte("a forged root "), 1000)
	if err := s.PutRoot(t.Context(), id, func(w io.Writer) error { _, err := w.Write(forged); return err }); err != nil {
		t.Fatal(err)
	}
	_, refusal := wakeReads(t, a.c, id)
	if !errors.Is(refusal, image.ErrRootStream) {
		t.Fatalf("a wake read the forged root: %v", refusal)
	}
	var bDone chan error
	a.c.testHook = func(step string) {
		if step == "store-root-shown-bad" && bDone == nil {
			// Another node's wake deleted it meanwhile, and a sleep
			// on the root uploads it anew.
			if err := s.DeleteRoot(t.Context(), id); err != nil {
				t.Error(err)
			}
			bDone = b.putRacing(t, "b1")
		}
	}
	a.c.dropStoreRoot(t.Context(), id, refusal)
	if bDone == nil {
		t.Fatal("the drop never reached store-root-shown-bad")
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	got, err := wakeReads(t, a.c, id)
	if err != nil || !bytes.Equal(got, b.stream) {
		t.Fatalf("the good root uploaded while a bad one was being deleted: %d bytes, %v", len(got), err)
	}
}

// rootSweepDropsSum: when the sweep deletes a root no image names, the
// digest recorded for it in etcd goes in the same step; a root uploaded
// anew while the sweep deleted the old one (hook: after the sweep's
// second look at the refs) keeps its fresh digest.
func rootSweepDropsSum(t *testing.T, cli *clientv3.Client, store func(*testing.T) storeRoots, kind string) {
	s := store(t)
	id := rootIDOf("a swept root " + kind)
	a, b := newRootNode(t, cli, s, "a-"+kind, id), newRootNode(t, cli, s, "b-"+kind, id)
	a.copies.SetRootGrace(0)
	gone := func() bool {
		has, err := s.HasRoot(t.Context(), id)
		return err == nil && !has
	}
	if err := a.put(t, "a1"); err != nil {
		t.Fatal(err)
	}
	if sum, err := a.c.RootSum(t.Context(), id); err != nil || sum == nil {
		t.Fatalf("no digest recorded at the upload: %x %v", sum, err)
	}
	if err := a.copies.Drop("sleep/a1"); err != nil {
		t.Fatal(err)
	}
	pollStore(t, "the root deleted", func() (bool, string) { return gone(), "" })
	pollStore(t, "its digest deleted with it", func() (bool, string) {
		sum, err := a.c.RootSum(t.Context(), id)
		return err == nil && sum == nil, fmt.Sprintf("%x %v", sum, err)
	})

	// Anew, while the sweep deletes the root: b uploads it after the
	// sweep found no ref the second time.
	if err := a.put(t, "a2"); err != nil {
		t.Fatal(err)
	}
	bDone := make(chan chan error, 1)
	swept := make(chan struct{})
	a.copies.SetTestHook(func(step string) {
		switch step {
		case "root-sweep-refs-relisted":
			bDone <- b.putRacing(t, "b1")
		case "root-sweep-done":
			close(swept)
		}
	})
	if err := a.copies.Drop("sleep/a2"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-swept:
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
	if err := <-<-bDone; err != nil {
		t.Fatal(err)
	}
	got, err := wakeReads(t, a.c, id)
	if err != nil || !bytes.Equal(got, b.stream) {
		t.Fatalf("a root uploaded anew while the sweep deleted the old one: %d bytes, %v", len(got), err)
	}
}

// pollStore polls cond (the store and etcd, written by a drop's
// background delete) until it holds, for two minutes at most.
func pollStore(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2m (%s)", what, state)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond): // polling the store
		}
	}
}

// TestRootLock: one holder at a time (a second waits, told so, until the
// first lets go); a write under a lock that went (its key deleted, as when
// the holder's lease lapses) is refused as ErrRootLockLost and changes
// nothing; a lock an earlier run of the daemon left on this node's lease
// is broken, not waited for.
func TestRootLock(t *testing.T) {
	cli := startEtcd(t)
	a, err := Join(t.Context(), cli, Config{Node: "a", Addr: "127.0.0.1:1", LeaseTTL: 3 * time.Second,
		Log:      slog.New(slog.DiscardHandler),
		Capacity: func(context.Context) (api.NodeCapacity, error) { return api.NodeCapacity{Cores: 2, Sandboxes: 1}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	id := rootIDOf("a locked root")
	first, err := a.LockRoot(t.Context(), id, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		lk, err := a.LockRoot(t.Context(), id, func() { close(waiting) })
		if err == nil {
			lk.Unlock()
		}
		got <- err
	}()
	select {
	case <-waiting:
	case err := <-got:
		t.Fatalf("a second holder got the lock while the first held it: %v", err)
	}
	sum := sha256.Sum256([]byte("a stream"))
	if err := first.RecordSum(t.Context(), sum[:]); err != nil {
		t.Fatal(err)
	}
	first.Unlock()
	if err := <-got; err != nil {
		t.Fatalf("the second holder, once the first let go: %v", err)
	}
	if rec, err := a.RootSum(t.Context(), id); err != nil || !bytes.Equal(rec, sum[:]) {
		t.Fatalf("the sum recorded under the lock: %x %v", rec, err)
	}

	// The lock goes (the lease lapsed): nothing is written under it.
	lk, err := a.LockRoot(t.Context(), id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(t.Context(), rootLockKey(id)); err != nil {
		t.Fatal(err)
	}
	other := sha256.Sum256([]byte("another stream"))
	if err := lk.RecordSum(t.Context(), other[:]); !errors.Is(err, snapstore.ErrRootLockLost) {
		t.Fatalf("a record under a lock that went: %v, want ErrRootLockLost", err)
	}
	if err := lk.DropSum(t.Context()); !errors.Is(err, snapstore.ErrRootLockLost) {
		t.Fatalf("a drop under a lock that went: %v, want ErrRootLockLost", err)
	}
	if rec, err := a.RootSum(t.Context(), id); err != nil || !bytes.Equal(rec, sum[:]) {
		t.Fatalf("the sum after writes under a lock that went: %x %v (want %x)", rec, err, sum)
	}
	lk.Unlock()

	// An earlier run's lock on this node's lease.
	lease, _ := a.current()
	if _, err := cli.Put(t.Context(), rootLockKey(id), "a/0123456789abcdef", clientv3.WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	lk, err = a.LockRoot(t.Context(), id, func() { t.Error("waited for an earlier run's lock") })
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.DropSum(t.Context()); err != nil {
		t.Fatal(err)
	}
	lk.Unlock()
	if rec, err := a.RootSum(t.Context(), id); err != nil || rec != nil {
		t.Fatalf("the sum after its drop: %x %v", rec, err)
	}
}
