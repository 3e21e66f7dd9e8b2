package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
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
