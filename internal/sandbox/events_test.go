package sandbox

import (
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/events"
)

// nextEvent returns the subscription's next event, failing after 5 s.
func nextEvent(t *testing.T, sub *events.Subscription) events.Event {
	t.Helper()
	select {
	case e := <-sub.C():
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return events.Event{}
}

// TestStoppedAndRefusedEvents: a sandbox that dies by itself raises
// stopped with the engine's reason; a refused admission raises
// admission.refused with the refusal's message.
func TestStoppedAndRefusedEvents(t *testing.T) {
	total, err := memTotalMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	e := newEnv(t, Config{MemoryOvercommit: 1024.0 / float64(total)})
	_, sub, err := e.m.Events().Subscribe(0, false, events.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sb := e.create(t, 512)
	for _, want := range []events.Type{events.Created, events.Started} {
		if ev := nextEvent(t, sub); ev.Type != want || ev.Sandbox != sb.ID {
			t.Fatalf("event %+v, want %s of %s", ev, want, sb.ID)
		}
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 1024}); err == nil {
		t.Fatal("a create past the overcommit ratio was admitted")
	}
	if ev := nextEvent(t, sub); ev.Type != events.AdmissionRefused || !strings.Contains(ev.Reason, "overcommit") {
		t.Fatalf("event %+v, want admission.refused about the overcommit", ev)
	}
	const reason = "the sandbox exceeded its memory limit and was killed"
	e.eng.Kill(sb.Engine(), reason)
	if ev := nextEvent(t, sub); ev.Type != events.Stopped || ev.Sandbox != sb.ID || ev.Reason != reason {
		t.Fatalf("event %+v, want stopped of %s with the engine's reason", ev, sb.ID)
	}
}
