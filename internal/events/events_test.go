package events

import (
	"fmt"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

func seqs(evs []Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

func TestRingAndResume(t *testing.T) {
	b := New(4)
	first := b.Latest() + 1
	for i := range 6 {
		e := b.Publish(Event{Type: Created, Sandbox: fmt.Sprint("sb", i)})
		if e.Seq != first+uint64(i) || e.Time.IsZero() {
			t.Fatalf("event %d: seq %d time %v, want seq %d and a time", i, e.Seq, e.Time, first+uint64(i))
		}
	}
	// Kept: the last 4, first+2 .. first+5.
	for _, tc := range []struct {
		name  string
		since uint64
		want  []uint64
		class errdefs.Class
	}{
		{"all kept", 0, []uint64{first + 2, first + 3, first + 4, first + 5}, ""},
		{"exactly the oldest missing", first + 1, []uint64{first + 2, first + 3, first + 4, first + 5}, ""},
		{"some", first + 3, []uint64{first + 4, first + 5}, ""},
		{"none missed", first + 5, nil, ""},
		{"lost", first, nil, errdefs.NotFound},
		{"an earlier daemon's", 12345, nil, errdefs.NotFound},
		{"from the future", first + 6, nil, errdefs.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.Since(tc.since, Filter{})
			if tc.class != "" {
				if errdefs.ClassOf(err) != tc.class {
					t.Fatalf("Since(%d): %v, want a %s error", tc.since, err, tc.class)
				}
				return
			}
			if err != nil || fmt.Sprint(seqs(got)) != fmt.Sprint(tc.want) {
				t.Fatalf("Since(%d) = %v, %v; want %v", tc.since, seqs(got), err, tc.want)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	e := Event{Sandbox: "0123456789abcdef", Name: "web", Labels: map[string]string{"team": "a", "env": "dev"}}
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Sandbox: "0123456789abcdef"}, true},
		{Filter{Sandbox: "web"}, true},
		{Filter{Sandbox: "other"}, false},
		{Filter{Labels: map[string]string{"team": "a"}}, true},
		{Filter{Labels: map[string]string{"team": "a", "env": "dev"}}, true},
		{Filter{Labels: map[string]string{"team": "b"}}, false},
		{Filter{Labels: map[string]string{"missing": ""}}, false},
		{Filter{Sandbox: "web", Labels: map[string]string{"team": "b"}}, false},
	} {
		if got := tc.f.Match(e); got != tc.want {
			t.Errorf("%+v.Match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// TestSubscribeNoGap: the backlog and the live events meet exactly, and a
// subscriber that falls behind is cut off with a reason, keeping what it
// had received in order.
func TestSubscribeNoGap(t *testing.T) {
	b := New(16)
	start := b.Publish(Event{Type: Created, Sandbox: "a"})
	b.Publish(Event{Type: Started, Sandbox: "b"})
	b.Publish(Event{Type: Started, Sandbox: "a"})
	backlog, sub, err := b.Subscribe(start.Seq, true, Filter{Sandbox: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if len(backlog) != 1 || backlog[0].Seq != start.Seq+2 {
		t.Fatalf("backlog %v, want just seq %d", seqs(backlog), start.Seq+2)
	}
	live := b.Publish(Event{Type: Removed, Sandbox: "a"})
	b.Publish(Event{Type: Removed, Sandbox: "b"})
	if got := <-sub.C(); got.Seq != live.Seq {
		t.Fatalf("live event %d, want %d", got.Seq, live.Seq)
	}

	slow, err2 := func() (*Subscription, error) { _, s, err := b.Subscribe(0, false, Filter{}); return s, err }()
	if err2 != nil {
		t.Fatal(err2)
	}
	for range subBuffer + 1 {
		b.Publish(Event{Type: ExecStarted, Sandbox: "c"})
	}
	<-slow.Done()
	if !errdefs.IsUnavailable(slow.Err()) {
		t.Fatalf("slow subscriber ended with %v, want unavailable", slow.Err())
	}
	if len(slow.C()) != subBuffer {
		t.Fatalf("slow subscriber kept %d events, want %d", len(slow.C()), subBuffer)
	}
	sub.Close()
	sub.Close() // idempotent
	if sub.Err() != nil {
		t.Fatalf("closed subscription's Err = %v, want nil", sub.Err())
	}
}
