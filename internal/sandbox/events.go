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
	mu   sync.Mutex
	meta map[string]sandboxMeta // guarded by mu
}

type sandboxMeta struct {
	name   string
	labels map[string]string
}

func newEventLog(ring int) *eventLog {
	return &eventLog{bus: events.New(ring), meta: map[string]sandboxMeta{}}
}

// emitRec publishes e about rec.
func (m *Manager) emitRec(rec store.Sandbox, e events.Event) {
	md := sandboxMeta{name: rec.Name, labels: maps.Clone(rec.Opts.Labels)}
	m.events.mu.Lock()
	m.events.meta[rec.ID] = md
	m.events.mu.Unlock()
	e.Sandbox, e.Name, e.Labels = rec.ID, md.name, md.labels
	m.events.bus.Publish(e)
}

// emitID publishes e about the sandbox id, with the name and labels last
// seen for it (read from the store once if none were).
func (m *Manager) emitID(id string, e events.Event) {
	m.events.mu.Lock()
	md, ok := m.events.meta[id]
	m.events.mu.Unlock()
	if !ok && id != "" {
		if rec, err := m.store.GetSandbox(context.Background(), id); err == nil {
			md = sandboxMeta{name: rec.Name, labels: maps.Clone(rec.Opts.Labels)}
			m.events.mu.Lock()
			m.events.meta[id] = md
			m.events.mu.Unlock()
		}
	}
	e.Sandbox, e.Name, e.Labels = id, md.name, md.labels
	m.events.bus.Publish(e)
}

// emitRemoved publishes the removal of id and forgets it.
func (m *Manager) emitRemoved(id string) {
	m.emitID(id, events.Event{Type: events.Removed})
	m.events.mu.Lock()
	delete(m.events.meta, id)
	m.events.mu.Unlock()
}

// emitMove publishes the event a state change means, if any: creating ->
// running is started, suspending -> sleeping slept, waking -> running
// woken, anything -> stopped stopped (msg is the reason).
func (m *Manager) emitMove(rec store.Sandbox, from, to, msg string) {
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
	m.emitRec(rec, e)
}

// emitRefused publishes an admission refusal.
func (m *Manager) emitRefused(err error) {
	m.events.bus.Publish(events.Event{Type: events.AdmissionRefused, Reason: err.Error()})
}

// observeExecs makes sb's guest report the execs of sandbox id.
func (m *Manager) observeExecs(id string, g *guest.Conn) {
	g.SetObserver(func(x guest.ExecEvent) {
		e := events.Event{Type: events.ExecStarted, Exec: &events.Exec{Cmd: x.Argv, TTY: x.TTY, PID: x.PID}}
		if x.Ended {
			e.Type = events.ExecEnded
			e.Exec.Code, e.Exec.Signal, e.Exec.TimedOut, e.Exec.Error = x.Exit.Code, x.Exit.Signal, x.Exit.TimedOut, x.Exit.Error
			if x.Err != nil {
				e.Exec.Code, e.Exec.Error = -1, x.Err.Error()
			}
		}
		m.emitID(id, e)
	})
}

// refused publishes an admission refusal and returns err.
func (m *Manager) refused(err error) error {
	m.emitRefused(err)
	return err
}
