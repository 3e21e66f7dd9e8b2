// Package events is clade's lifecycle event bus: the sandbox service
// publishes what happens to sandboxes (created, started, exec started and
// ended, snapshotted, forked, slept, woken, stopped, removed, admission
// refused; in a cluster, lost) and fronts stream it to clients. The bus keeps a bounded ring of
// recent events, each with a sequence number, so a client that lost its
// connection resumes exactly where it left off, or learns that it cannot.
//
// Sequence numbers increase by one per event and keep increasing across
// daemon restarts without being stored: a bus numbers from its start time
// in microseconds, which is past every number an earlier daemon could have
// reached (that would take more than one event per microsecond). A resume
// from a number of an earlier daemon therefore reports the events lost.
package events

import (
	"fmt"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Type names what happened.
type Type string

const (
	Created     Type = "created"      // recorded; it is being made (booted or restored)
	Started     Type = "started"      // it runs, after a create or a fork
	ExecStarted Type = "exec.started" // a command started in it
	ExecEnded   Type = "exec.ended"   // a command ended (Exec says how)
	Snapshotted Type = "snapshotted"  // a snapshot of it was taken (Snapshot)
	Forked      Type = "forked"       // children were restored from Snapshot (Children)
	Slept       Type = "slept"        // it sleeps: on disk, no memory
	Woken       Type = "woken"        // it runs again after sleeping
	Stopped     Type = "stopped"      // it stopped by itself (Reason)
	Removed     Type = "removed"      // it is gone, with its record
	// AdmissionRefused: a create, fork or wake (or a snapshot or sleep, on
	// disk) was refused for want of memory or disk (Reason).
	AdmissionRefused Type = "admission.refused"
	// Lost (a cluster): the node that holds the sandbox left the cluster
	// (its lease lapsed) while it was not asleep, and this node marked
	// its record lost (Reason); published once, by the node that marked it.
	Lost Type = "lost"
)

// Event is one thing that happened. Fields that do not apply are zero.
type Event struct {
	// Seq is the event's sequence number: one more than the last one's.
	Seq  uint64
	Time time.Time
	Type Type
	// Sandbox is the sandbox's id, with its name and labels as they were.
	Sandbox string
	Name    string
	Labels  map[string]string
	// Snapshot is the snapshot taken (Snapshotted) or forked from (Forked,
	// Started of a restored sandbox).
	Snapshot string
	// Children are the sandboxes a fork made (Forked); Failed counts the
	// children that failed.
	Children []string
	Failed   int
	// Reason says why (Stopped, AdmissionRefused).
	Reason string
	// Exec describes the command (ExecStarted, ExecEnded).
	Exec *Exec
}

// Exec is the command of an exec event.
type Exec struct {
	Cmd []string
	TTY bool
	PID int
	// ExecEnded only: how it ended. Error says why it did not run, or that
	// it was lost.
	Code     int
	Signal   int
	TimedOut bool
	Error    string
}

// Filter selects events; zero fields match everything.
type Filter struct {
	// Sandbox matches an event's sandbox id or name.
	Sandbox string
	// Labels must all be on the event's sandbox with these values.
	Labels map[string]string
}

// Match reports whether e passes f.
func (f Filter) Match(e Event) bool {
	if f.Sandbox != "" && f.Sandbox != e.Sandbox && f.Sandbox != e.Name {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := e.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// DefaultRing is how many recent events a bus keeps for resumes.
const DefaultRing = 4096

// subBuffer is how many events a subscriber may fall behind before it is
// cut off (it resumes from its last sequence number).
const subBuffer = 1024

// Bus fans events out to subscribers and keeps the last ones. Safe for
// concurrent use; Publish never blocks.
type Bus struct {
	mu   sync.Mutex
	ring []Event // guarded by mu: the last len(ring) events, ring[head] the oldest once full
	head int     // guarded by mu
	size int
	next uint64 // guarded by mu: the next event's Seq
	subs map[*Subscription]struct{}
	now  func() time.Time
}

// New returns a bus that keeps the last size events (DefaultRing if size
// is not positive).
func New(size int) *Bus {
	if size <= 0 {
		size = DefaultRing
	}
	return &Bus{size: size, next: uint64(time.Now().UnixMicro()), subs: map[*Subscription]struct{}{}, now: time.Now}
}

// Publish numbers e, stamps its time, keeps it and hands it to every
// matching subscriber; a subscriber too far behind is cut off (its Err
// says so). It returns the event as published.
func (b *Bus) Publish(e Event) Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.Seq = b.next
	b.next++
	e.Time = b.now()
	if len(b.ring) < b.size {
		b.ring = append(b.ring, e)
	} else {
		b.ring[b.head] = e
		b.head = (b.head + 1) % b.size
	}
	for s := range b.subs {
		if !s.filter.Match(e) {
			continue
		}
		select {
		case s.c <- e:
		default:
			s.endLocked(errdefs.New(errdefs.Unavailable, "event stream fell %d events behind and was cut off: resume from the last seq received", subBuffer))
		}
	}
	return e
}

// Latest returns the last published event's Seq (one less than the next
// one's when none was published yet).
func (b *Bus) Latest() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next - 1
}

// oldestLocked is the Seq of the oldest kept event (next when none).
func (b *Bus) oldestLocked() uint64 { return b.next - uint64(len(b.ring)) }

// Since returns the kept events after seq that match f, in order; seq 0
// means every kept event. It returns a NotFound error when some events
// after seq are no longer kept (or were an earlier daemon's), and an
// InvalidArgument error for a seq past the latest event.
func (b *Bus) Since(seq uint64, f Filter) ([]Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sinceLocked(seq, f)
}

func (b *Bus) sinceLocked(seq uint64, f Filter) ([]Event, error) {
	if seq == 0 {
		seq = b.oldestLocked() - 1
	}
	if seq >= b.next {
		return nil, errdefs.New(errdefs.InvalidArgument, "since=%d is past the latest event, %d: give a seq this daemon sent", seq, b.next-1)
	}
	if oldest := b.oldestLocked(); seq+1 < oldest {
		return nil, errdefs.New(errdefs.NotFound,
			"events after seq %d are no longer kept (the daemon keeps the last %d; the oldest now is %d, and a restarted daemon keeps none of the last one's): list the sandboxes again and follow from now",
			seq, b.size, oldest)
	}
	var out []Event
	for i := range b.ring {
		e := b.ring[(b.head+i)%len(b.ring)]
		if e.Seq > seq && f.Match(e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// Subscription receives the events published after it was made.
type Subscription struct {
	// Start is the Seq of the last event published before the
	// subscription: its live events are those after Start.
	Start  uint64
	b      *Bus
	filter Filter
	c      chan Event
	done   chan struct{}
	err    error // set before done closes
}

// Subscribe returns the kept events after since that match f (Since),
// and a subscription to those published from then on, with nothing lost
// or repeated in between. With hasSince false the backlog is empty. The
// errors are Since's. Close the subscription when done.
func (b *Bus) Subscribe(since uint64, hasSince bool, f Filter) ([]Event, *Subscription, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var backlog []Event
	if hasSince {
		var err error
		if backlog, err = b.sinceLocked(since, f); err != nil {
			return nil, nil, err
		}
	}
	s := &Subscription{Start: b.next - 1, b: b, filter: f, c: make(chan Event, subBuffer), done: make(chan struct{})}
	b.subs[s] = struct{}{}
	return backlog, s, nil
}

// C yields the subscription's events; it is never closed: select on Done
// too.
func (s *Subscription) C() <-chan Event { return s.c }

// Done is closed when the subscription ends (Close, or cut off); Err says
// why.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err is why the subscription ended: nil after Close, an Unavailable
// error when it fell behind.
func (s *Subscription) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Close ends the subscription; it is idempotent.
func (s *Subscription) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.endLocked(nil)
}

func (s *Subscription) endLocked(err error) {
	if _, ok := s.b.subs[s]; !ok {
		return
	}
	delete(s.b.subs, s)
	s.err = err
	close(s.done)
}

// String is for logs.
func (e Event) String() string {
	return fmt.Sprintf("#%d %s %s", e.Seq, e.Type, e.Sandbox)
}
