package sandbox

import (
	"context"
	"maps"
	"sync"

	"github.com/clade-sandbox/clade/internal/events"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// Events returns the service's lifecycle event bus (package events): what
// happens to sandboxes, as it happens, for fronts to stream.
func (m *Manager) Events() *events.Bus { return m.events.bus }

// eventLog publishes the service's events. It remembers each sandbox's
// name and labels from its last event with a record, so that events raised
// where only the id is at hand (an exec, a removal) carry them too.
type eventLog struct {
	bus  *events.Bus
	recs store.Sandboxes // where emitID reads a name it has not seen
	mu   sync.Mutex
	meta map[string]sandboxMeta // guarded by mu
}

type sandboxMeta struct {
	name   string
	labels map[string]string
}

func newEventLog(ring int, recs store.Sandboxes) *eventLog {
	return &eventLog{bus: events.New(ring), recs: recs, meta: map[string]sandboxMeta{}}
}

// emitRec publishes e about rec.
func (l *eventLog) emitRec(rec store.Sandbox, e events.Event) {
	md := sandboxMeta{name: rec.Name, labels: maps.Clone(rec.Opts.Labels)}
	l.mu.Lock()
	l.meta[rec.ID] = md
	l.mu.Unlock()
	e.Sandbox, e.Name, e.Labels = rec.ID, md.name, md.labels
	l.bus.Publish(e)
}

// emitID publishes e about the sandbox id, with the name and labels last
// seen for it (read from the store once if none were).
func (l *eventLog) emitID(id string, e events.Event) {
	l.mu.Lock()
	md, ok := l.meta[id]
	l.mu.Unlock()
	if !ok && id != "" {
		if rec, err := l.recs.GetSandbox(context.Background(), id); err == nil {
			md = sandboxMeta{name: rec.Name, labels: maps.Clone(rec.Opts.Labels)}
			l.mu.Lock()
			l.meta[id] = md
			l.mu.Unlock()
		}
	}
	e.Sandbox, e.Name, e.Labels = id, md.name, md.labels
	l.bus.Publish(e)
}

// emitRemoved publishes the removal of id and forgets it.
func (l *eventLog) emitRemoved(id string) {
	l.emitID(id, events.Event{Type: events.Removed})
	l.mu.Lock()
	delete(l.meta, id)
	l.mu.Unlock()
}

// emitMove publishes the event a state change means, if any: creating ->
// running is started, suspending -> sleeping slept, waking -> running
// woken, anything -> stopped stopped (msg is the reason).
func (l *eventLog) emitMove(rec store.Sandbox, from, to, msg string) {
	var e events.Event
	switch {
	case from == store.StateCreating && to == store.StateRunning:
		e = events.Event{Type: events.Started, Snapshot: rec.Snapshot}
	case from == store.StateSuspending && to == store.StateSleeping:
		e = events.Event{Type: events.Slept}
	case from == store.StateWaking && to == store.StateRunning:
		e = events.Event{Type: events.Woken}
	case to == store.StateStopped:
		e = events.Event{Type: events.Stopped, Reason: msg}
	default:
		return
	}
	l.emitRec(rec, e)
}

// emitRefused publishes an admission refusal.
func (l *eventLog) emitRefused(err error) {
	l.bus.Publish(events.Event{Type: events.AdmissionRefused, Reason: err.Error()})
}

// observeExecs makes sb's guest report the execs of sandbox id.
func (l *eventLog) observeExecs(id string, g *guest.Conn) {
	g.SetObserver(func(x guest.ExecEvent) {
		e := events.Event{Type: events.ExecStarted, Exec: &events.Exec{Cmd: x.Argv, TTY: x.TTY, PID: x.PID}}
		if x.Ended {
			e.Type = events.ExecEnded
			e.Exec.Code, e.Exec.Signal, e.Exec.TimedOut, e.Exec.Error = x.Exit.Code, x.Exit.Signal, x.Exit.TimedOut, x.Exit.Error
			if x.Err != nil {
				e.Exec.Code, e.Exec.Error = -1, x.Err.Error()
			}
		}
		l.emitID(id, e)
	})
}

// refused publishes an admission refusal and returns err.
func (l *eventLog) refused(err error) error {
	l.emitRefused(err)
	return err
}
