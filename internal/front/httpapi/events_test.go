package httpapi_test

import (
	"context"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// collector reads an event stream in the background.
type collector struct {
	ch     chan sdk.Event
	errc   chan error
	cancel context.CancelFunc
}

func collect(t *testing.T, c *sdk.Client, f sdk.EventFilter) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	evs, err := c.Events(ctx, f)
	if err != nil {
		cancel()
		t.Fatalf("events %+v: %v", f, err)
	}
	col := &collector{ch: make(chan sdk.Event, 1000), errc: make(chan error, 1), cancel: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e, err := range evs {
			if err != nil {
				col.errc <- err
				return
			}
			col.ch <- e
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return col
}

// next returns the next event, failing the test after 30 s.
func (col *collector) next(t *testing.T) sdk.Event {
	t.Helper()
	select {
	case e := <-col.ch:
		return e
	case err := <-col.errc:
		t.Fatalf("event stream failed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return sdk.Event{}
}

// until reads events until one of type typ about sandbox id, returning
// all read.
func (col *collector) until(t *testing.T, typ, id string) []sdk.Event {
	t.Helper()
	var out []sdk.Event
	for {
		e := col.next(t)
		out = append(out, e)
		if e.Type == typ && e.Sandbox == id {
			return out
		}
	}
}

func types(evs []sdk.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func all(t *testing.T, seq iter.Seq2[sdk.Event, error]) []sdk.Event {
	t.Helper()
	var out []sdk.Event
	for e, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestEvents: a create, exec, fork, sleep, wake and remove show up as
// events in order, with consecutive seqs, filtered by sandbox and label;
// a stream resumed after a disconnect gets exactly the events it missed;
// a resume the daemon can no longer serve says so.
func TestEvents(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()

	// Opened before anything happens: Events returns once subscribed.
	everything := collect(t, c, sdk.EventFilter{Follow: true})
	labelled := collect(t, c, sdk.EventFilter{Follow: true, Labels: map[string]string{"team": "evt"}})

	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "evt-box", Labels: map[string]string{"team": "evt"}})
	other := newSandbox(t, c, sdk.CreateSandboxRequest{})
	mine := collect(t, c, sdk.EventFilter{Follow: true, Sandbox: sb.ID})
	byName := collect(t, c, sdk.EventFilter{Follow: true, Sandbox: "evt-box"})

	if st, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "exit 4"}}); err != nil || st.Code != 4 {
		t.Fatalf("exec: %+v %v", st, err)
	}
	fr, err := c.Fork(ctx, sb.ID, 1)
	if err != nil || len(fr.Children) != 1 || fr.Children[0].ID == "" {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	child := fr.Children[0].ID

	// A stream that reads two of its events and disconnects.
	early := collect(t, c, sdk.EventFilter{Follow: true, Sandbox: sb.ID, Kept: true})
	seen := []sdk.Event{early.next(t), early.next(t)}
	early.cancel()

	if _, err := c.Sleep(ctx, sb.ID); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if _, err := c.Wake(ctx, sb.ID); err != nil {
		t.Fatalf("wake: %v", err)
	}
	for _, id := range []string{child, sb.ID, other.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatalf("rm %s: %v", id, err)
		}
	}

	got := mine.until(t, api.EventRemoved, sb.ID)
	want := []string{api.EventExecStarted, api.EventExecEnded, api.EventSnapshotted, api.EventForked,
		api.EventSlept, api.EventWoken, api.EventRemoved}
	if !slices.Equal(types(got), want) {
		t.Fatalf("events of the sandbox: %v, want %v", types(got), want)
	}
	for _, e := range got {
		if e.Sandbox != sb.ID || e.Name != "evt-box" || e.Labels["team"] != "evt" || e.Time.IsZero() {
			t.Errorf("event %+v: want sandbox %s named evt-box with its label and a time", e, sb.ID)
		}
	}
	if x := got[0].Exec; x == nil || !slices.Equal(x.Cmd, []string{"sh", "-c", "exit 4"}) || x.PID == 0 {
		t.Errorf("exec.started: %+v, want the command and its pid", got[0].Exec)
	}
	if x := got[1].Exec; x == nil || x.Code != 4 {
		t.Errorf("exec.ended: %+v, want code 4", got[1].Exec)
	}
	if e := got[3]; e.Snapshot == "" || e.Snapshot != got[2].Snapshot || !slices.Equal(e.Children, []string{child}) {
		t.Errorf("forked %+v: want the snapshot taken (%s) and child %s", e, got[2].Snapshot, child)
	}
	if n := byName.until(t, api.EventRemoved, sb.ID); !slices.Equal(types(n), want) {
		t.Errorf("events by name: %v, want %v", types(n), want)
	}

	// The whole stream: consecutive seqs, and the sandbox's life in order
	// around the child's.
	full := everything.until(t, api.EventRemoved, other.ID)
	for i := 1; i < len(full); i++ {
		if full[i].Seq != full[i-1].Seq+1 {
			t.Fatalf("seq %d follows %d: the stream skipped or reordered events", full[i].Seq, full[i-1].Seq)
		}
	}
	var life []string
	for _, e := range full {
		switch e.Sandbox {
		case sb.ID:
			life = append(life, e.Type)
		case child:
			life = append(life, "child "+e.Type)
		}
	}
	wantLife := []string{api.EventCreated, api.EventStarted, api.EventExecStarted, api.EventExecEnded, api.EventSnapshotted,
		"child " + api.EventCreated, "child " + api.EventStarted, api.EventForked,
		api.EventSlept, api.EventWoken, "child " + api.EventRemoved, api.EventRemoved}
	if !slices.Equal(life, wantLife) {
		t.Errorf("life of the sandbox and its child:\n got %v\nwant %v", life, wantLife)
	}

	// The label filter passes the labelled sandbox and its child (which
	// inherits the label), not the other one.
	for _, e := range labelled.until(t, api.EventRemoved, sb.ID) {
		if e.Sandbox != sb.ID && e.Sandbox != child {
			t.Errorf("label-filtered stream has an event of %s: %+v", e.Sandbox, e)
		}
	}

	// Resume after the disconnect: exactly the missed events, in order.
	resumed := collect(t, c, sdk.EventFilter{Follow: true, Sandbox: sb.ID, Since: seen[1].Seq})
	missed := resumed.until(t, api.EventRemoved, sb.ID)
	var wantMissed []sdk.Event
	for _, e := range full {
		if e.Sandbox == sb.ID && e.Seq > seen[1].Seq {
			wantMissed = append(wantMissed, e)
		}
	}
	if fmt.Sprint(seqsOf(missed)) != fmt.Sprint(seqsOf(wantMissed)) || !slices.Equal(types(missed), types(wantMissed)) {
		t.Errorf("resumed after seq %d: %v %v, want %v %v", seen[1].Seq, seqsOf(missed), types(missed), seqsOf(wantMissed), types(wantMissed))
	}
	if !slices.Equal(types(seen), []string{api.EventCreated, api.EventStarted}) {
		t.Errorf("the early stream began with %v, want created, started", types(seen))
	}

	// Without follow: the kept events, then the end.
	kept, err := c.Events(ctx, sdk.EventFilter{Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if k := all(t, kept); len(k) != 9 || k[0].Type != api.EventCreated || k[8].Type != api.EventRemoved {
		t.Errorf("kept events of the sandbox: %v, want its 9 from created to removed", types(k))
	}

	// Bad input and lost events.
	if _, err := c.Events(ctx, sdk.EventFilter{Follow: true, Since: 1}); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), "no longer kept") {
		t.Errorf("resume from seq 1: %v, want not found saying the events are no longer kept", err)
	}
	if _, err := c.Events(ctx, sdk.EventFilter{Follow: true, Since: full[len(full)-1].Seq + 1000}); !sdk.IsInvalidArgument(err) {
		t.Errorf("resume from the future: %v, want invalid argument", err)
	}
	for _, q := range []string{"since=abc", "follow=maybe", "label=novalue"} {
		resp, err := rawClient(d).Get("http://clade/v1/events?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/events?%s: %s, want 400", q, resp.Status)
		}
	}

	// A restarted daemon numbers past the old one and cannot resume it.
	last := full[len(full)-1].Seq
	d.Kill()
	d.Start(nil)
	if _, err := c.Events(ctx, sdk.EventFilter{Follow: true, Since: last}); !sdk.IsNotFound(err) {
		t.Errorf("resume across a restart: %v, want not found (events lost)", err)
	}
	// A stream that was open through the restart resumes on its own and
	// learns the same.
	select {
	case err := <-everything.errc:
		if !sdk.IsNotFound(err) {
			t.Errorf("a stream open through the restart ended with %v, want not found (events lost)", err)
		}
	case e := <-everything.ch:
		t.Errorf("a stream open through the restart yielded %+v, want the loss reported", e)
	case <-time.After(30 * time.Second):
		t.Error("a stream open through the restart did not report the loss within 30s")
	}
	after := collect(t, c, sdk.EventFilter{Follow: true})
	sb2 := newSandbox(t, c, sdk.CreateSandboxRequest{})
	if e := after.next(t); e.Type != api.EventCreated || e.Sandbox != sb2.ID || e.Seq <= last {
		t.Errorf("first event after the restart: %+v, want created of %s with a seq above %d", e, sb2.ID, last)
	}
}

func seqsOf(evs []sdk.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}
