package cluster

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// TestAwaitImported: a call waiting on an importing child answers its
// record once its node writes it running, ok false once the record goes,
// and a retryable Unavailable past its bound (the record unchanged).
func TestAwaitImported(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	meta := api.SnapshotExport{Image: "default", MemoryMiB: 256, CPUs: 1}
	if err := a.PublishImporting(ctx, []string{"sbi1", "sbi2", "sbi3"}, meta); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		rec Record
		ok  bool
		err error
	}
	wait := func(id string, bound time.Duration) chan answer {
		ch := make(chan answer, 1)
		go func() {
			rec, ok, err := b.AwaitImported(ctx, id, bound)
			ch <- answer{rec, ok, err}
		}()
		return ch
	}
	made, failed := wait("sbi1", time.Minute), wait("sbi2", time.Minute)
	if _, _, err := b.AwaitImported(ctx, "sbi3", 300*time.Millisecond); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "still importing") {
		t.Fatalf("a wait past its bound: %v, want a retryable Unavailable saying it is still importing", err)
	}
	// Neither waiter answered while the records stayed importing.
	select {
	case got := <-made:
		t.Fatalf("sbi1's wait answered while it was importing: %+v", got)
	case got := <-failed:
		t.Fatalf("sbi2's wait answered while it was importing: %+v", got)
	default:
	}
	if err := a.PublishImage(ctx, api.Sandbox{ID: "sbi1", State: "running", Image: "default"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := a.Unpublish(ctx, "sbi2", false); err != nil {
		t.Fatal(err)
	}
	for id, ch := range map[string]chan answer{"sbi1": made, "sbi2": failed} {
		select {
		case got := <-ch:
			switch {
			case id == "sbi1" && (got.err != nil || !got.ok || got.rec.State != "running" || got.rec.Node != "a"):
				t.Fatalf("sbi1, made: %+v", got)
			case id == "sbi2" && (got.err != nil || got.ok):
				t.Fatalf("sbi2, its record removed: %+v", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the wait on %s did not answer within 10 s of its record's change", id)
		}
	}
}

// importLocal is the local service of a node importing one child: its
// record is creating while the fork restores it (the test says when the
// import is done, and how), and its removal is noted with whether the
// import was done then.
type importLocal struct {
	service.Service
	mu      sync.Mutex
	state   string // "" (no record), creating, running
	settled bool
	removes []bool // settled, at each Remove
}

func (l *importLocal) Running(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == "running"
}

func (l *importLocal) Get(_ context.Context, ref string) (api.Sandbox, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == "" {
		return api.Sandbox{}, errdefs.New(errdefs.NotFound, "no sandbox %s", ref)
	}
	return api.Sandbox{ID: ref, State: l.state, Image: "default"}, nil
}

func (l *importLocal) Remove(_ context.Context, ref string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removes = append(l.removes, l.settled)
	l.state = ""
	return nil
}

func (l *importLocal) set(state string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state, l.settled = state, true
}

func (l *importLocal) removed() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.removes)
}

// TestRemoveImportingHere: an rm sent to the node that is importing a
// fork's child, while the child's restore runs (its local record
// creating), waits for the import like an rm through another node: it
// neither drops the child's importing record nor removes a sandbox the
// fork is still making; once the import made the child it removes it
// (record and sandbox), and a child whose import failed is not there,
// as asked (nil, nothing removed).
func TestRemoveImportingHere(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	meta := api.SnapshotExport{Image: "default", MemoryMiB: 256, CPUs: 1}
	for _, made := range []bool{true, false} {
		t.Run(map[bool]string{true: "made", false: "failed"}[made], func(t *testing.T) {
			id := map[bool]string{true: "sbhere1", false: "sbhere2"}[made]
			local := &importLocal{state: "creating"}
			s := NewService(a, local)
			s.forks.importing.add([]string{id})
			if err := a.PublishImporting(ctx, []string{id}, meta); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Remove(ctx, id) }()
			select {
			case err := <-done:
				rec, ok, _ := a.Lookup(ctx, id)
				t.Fatalf("the rm answered %v while the child was being restored (its removals, import done at each: %v; its record: %v %+v)", err, local.removed(), ok, rec)
			case <-time.After(500 * time.Millisecond):
			}
			if rec, ok, err := a.Lookup(ctx, id); err != nil || !ok || rec.State != StateImporting {
				t.Fatalf("the child's record while its import runs: %+v %v %v, want importing", rec, ok, err)
			}
			// The import settles as the fork's does: the made child's
			// record written running, a failed one's removed.
			if made {
				local.set("running")
				if err := a.PublishImage(ctx, api.Sandbox{ID: id, State: "running", Image: "default"}, ""); err != nil {
					t.Fatal(err)
				}
			} else {
				local.set("")
				if err := a.Unpublish(ctx, id, false); err != nil {
					t.Fatal(err)
				}
			}
			s.forks.importing.done([]string{id})
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the rm once the import settled: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the rm did not answer within 10 s of the import's end")
			}
			want := []bool{}
			if made {
				want = []bool{true}
			}
			if got := local.removed(); !slices.Equal(got, want) {
				t.Fatalf("the local removals (import done at each): %v, want %v", got, want)
			}
			if rec, ok, err := a.Lookup(ctx, id); err != nil || ok {
				t.Fatalf("the child's record after the rm: %+v %v %v, want none", rec, ok, err)
			}
		})
	}
}

// TestAwaitImportedEtcdGone: a wait on an importing child whose node's
// etcd stops answering (before the wait, or during it) answers a
// retryable Unavailable within an etcd call's bound and a watch round,
// not at the end of the wait (an rm through that node hung for the
// import's bound and a minute, then said the child was still importing
// on node "").
func TestAwaitImportedEtcdGone(t *testing.T) {
	for _, during := range []bool{false, true} {
		t.Run(map[bool]string{false: "before", true: "during"}[during], func(t *testing.T) {
			e, err := StartEmbed(t.Context(), Embed{Name: "test", Dir: filepath.Join(t.TempDir(), "etcd"), Client: freeAddr(t), Peer: freeAddr(t)})
			if err != nil {
				t.Fatal(err)
			}
			stop := sync.OnceFunc(e.Close)
			t.Cleanup(stop)
			cli, err := Dial(t.Context(), e.Endpoints, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			a := join(t, cli, "a", "")
			if err := a.PublishImporting(t.Context(), []string{"sbgone"}, api.SnapshotExport{Image: "default", MemoryMiB: 256, CPUs: 1}); err != nil {
				t.Fatal(err)
			}
			if !during {
				stop()
			}
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, _, err := a.AwaitImported(t.Context(), "sbgone", 2*time.Minute)
				done <- err
			}()
			if during {
				stop()
			}
			bound := opTimeout + awaitRound + 5*time.Second
			select {
			case err := <-done:
				took := time.Since(start)
				if !errdefs.IsUnavailable(err) || took > bound {
					t.Fatalf("a wait with etcd gone: %v after %s, want a retryable Unavailable within %s", err, took.Round(time.Millisecond), bound)
				}
				t.Logf("answered %v after %s", err, took.Round(time.Millisecond))
			case <-time.After(bound):
				t.Fatalf("a wait with etcd gone did not answer within %s", bound)
			}
		})
	}
}

// TestAwaitSleepImage: a wake on another node that finds a sleeping
// record without its image's copy waits for the record to name it (its
// node writes it again as soon as the copy is sealed): it goes on at that
// write, not after its bound, and at once for a record that names one.
func TestAwaitSleepImage(t *testing.T) {
	cli := startEtcd(t)
	ctx := t.Context()
	a := join(t, cli, "a", "")
	defer a.Close()
	b := join(t, cli, "b", "")
	defer b.Close()
	sb := api.Sandbox{ID: "sbs1", State: "sleeping", Image: "default"}
	if err := a.PublishImage(ctx, sb, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.awaitSleepImage(ctx, "sbs1", time.Hour)
	}()
	select {
	case <-done:
		t.Fatal("the wait ended while the record named no image")
	case <-time.After(200 * time.Millisecond): // a wait that did not end yet
	}
	if err := a.PublishImage(ctx, sb, "sha256:"+strings.Repeat("ab", 32)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end at the write that named the image (its bound is an hour)")
	}
	// Named already: no wait at all, whatever the bound.
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		b.awaitSleepImage(ctx, "sbs1", time.Hour)
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("a wait on a record that names its image did not end")
	}
}
