package soak_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// outcome is what a client may conclude from an operation's answer.
type outcome int

const (
	// ok: the daemon acknowledged the operation; it must last.
	ok outcome = iota
	// failed: the daemon answered with an error (or, for a connection
	// that was refused, never saw the request): nothing was done.
	failed
	// unknown: the connection broke mid-request, the daemon died; either
	// outcome is fine, a half one is not.
	unknown
	// hung: the operation did not finish within its deadline.
	hung
)

// classify sorts an operation's error.
func classify(ctx context.Context, err error) outcome {
	var se *sdk.Error
	var ce *sdk.ConnectError
	switch {
	case err == nil:
		return ok
	case errors.As(err, &se):
		return failed
	case errors.As(err, &ce):
		return failed // refused: the request never reached a daemon
	case ctx.Err() != nil:
		return hung
	}
	return unknown
}

// errCode names an operation's error for the summary.
func errCode(err error) string {
	var se *sdk.Error
	var ce *sdk.ConnectError
	switch {
	case errors.As(err, &se):
		return se.Code
	case errors.As(err, &ce):
		return "connect"
	case err == nil:
		return ""
	}
	return "transport"
}

// sbox is what clients were told about one sandbox.
type sbox struct {
	id, name string
	// files were written with an acknowledgement: path -> sha256.
	files map[string]string
	// maybe were being written when the daemon died: absent or whole.
	maybe map[string]string
	// counter: 0 no counter process, 1 one runs, 2 it may (its start was
	// in flight when the daemon died).
	counter int
	// lastCount is the highest counter value seen: it never goes back.
	lastCount int
	// state is the state it must be in ("running", "sleeping"), or ""
	// when an operation that changes it was in flight at a crash.
	state string
	// maybeGone: a remove was in flight when the daemon died.
	maybeGone bool
	busy      bool
}

// snap is what clients were told about one snapshot.
type snap struct {
	id, name  string
	files     map[string]string
	counter   int
	implicit  bool
	maybeGone bool
	busy      bool
}

// model holds what the clients were told exists.
type model struct {
	mu    sync.Mutex
	sbs   map[string]*sbox
	snaps map[string]*snap
	// pendingCreates and pendingSnaps are names whose create or snapshot
	// was in flight when the daemon died: resolved by name at the next
	// check.
	pendingCreates map[string]bool
	pendingSnaps   map[string]*snap
	// unknownForks counts forks in flight at a crash: sandboxes the
	// clients never heard of may then exist (whole).
	unknownForks int
	// unknownBuilds counts builds in flight at a crash: their sandboxes
	// must be reaped by the next daemon.
	unknownBuilds int
	// failedBuilds counts builds that failed since the last check: the
	// daemon removes their sandboxes, in the background if a full disk
	// refused it at first.
	failedBuilds int
	// images were built (acknowledged) or may have been (unknown).
	images      []string
	maybeImages []string
	// strays are sandboxes no client was told of, reported already, whose
	// removal failed (on a full disk): removed at a later check.
	strays map[string]bool
	// deferred are build sandboxes of a crashed daemon that its successor
	// could not reap because the disk was full.
	deferred map[string]bool
}

func newModel() *model {
	return &model{sbs: map[string]*sbox{}, snaps: map[string]*snap{}, pendingCreates: map[string]bool{}, pendingSnaps: map[string]*snap{}, strays: map[string]bool{}, deferred: map[string]bool{}}
}

// live counts sandboxes, for the population cap.
func (m *model) live() int { return len(m.sbs) }

// freeSandboxes lists sandboxes no client is using, sorted (so a seeded
// run picks the same way), filtered by state when state is not empty.
func (m *model) freeSandboxes(state string) []*sbox {
	var out []*sbox
	for _, sb := range m.sbs {
		// One being removed (a remove cut short by a crash) is left alone.
		if !sb.busy && !sb.maybeGone && (state == "" || sb.state == state) {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (m *model) freeSnaps(explicitOnly bool) []*snap {
	var out []*snap
	for _, sn := range m.snaps {
		if !sn.busy && !(explicitOnly && sn.implicit) {
			out = append(out, sn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// stats counts operations by kind and outcome, and the faults.
type stats struct {
	mu        sync.Mutex
	ops       map[string]*opStats
	kills     int // SIGKILLs sent by the soak
	crashes   int // crash points (CLADE_CRASH_AT) that fired
	armed     []string
	fills     int
	filled    int64
	restarts  int
	checks    int
	lost      int
	unclear   int
	resolved  int // unknown outcomes resolved either way
	findings  []string
	fullFails map[string]int // errors during a full disk, by code
}

type opStats struct {
	run, ok, failed, unknown, hung int
	took                           time.Duration
	codes                          map[string]int
}

func newStats() *stats { return &stats{ops: map[string]*opStats{}, fullFails: map[string]int{}} }

func (s *stats) record(kind string, o outcome, code string, diskFull bool, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ops[kind]
	if st == nil {
		st = &opStats{codes: map[string]int{}}
		s.ops[kind] = st
	}
	st.run++
	st.took += took
	switch o {
	case ok:
		st.ok++
	case failed:
		st.failed++
	case unknown:
		st.unknown++
	case hung:
		st.hung++
	}
	if code != "" {
		st.codes[code]++
		if diskFull {
			s.fullFails[code]++
		}
	}
}

func (s *stats) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	kinds := make([]string, 0, len(s.ops))
	for k := range s.ops {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var tot opStats
	fmt.Fprintf(&b, "%-14s %5s %5s %6s %7s %4s %8s  errors by code\n", "operation", "run", "ok", "failed", "unknown", "hung", "mean")
	for _, k := range kinds {
		st := s.ops[k]
		tot.run += st.run
		tot.ok += st.ok
		tot.failed += st.failed
		tot.unknown += st.unknown
		tot.hung += st.hung
		fmt.Fprintf(&b, "%-14s %5d %5d %6d %7d %4d %8s  %s\n", k, st.run, st.ok, st.failed, st.unknown, st.hung,
			(st.took / time.Duration(st.run)).Round(time.Millisecond), fmtCounts(st.codes))
	}
	fmt.Fprintf(&b, "%-14s %5d %5d %6d %7d %4d\n", "total", tot.run, tot.ok, tot.failed, tot.unknown, tot.hung)
	fmt.Fprintf(&b, "faults: %d SIGKILLs, %d crash points fired (armed: %s), %d disk fills (%d MiB taken), %d restarts\n",
		s.kills, s.crashes, strings.Join(s.armed, ", "), s.fills, s.filled>>20, s.restarts)
	fmt.Fprintf(&b, "errors while the disk was full: %s\n", fmtCounts(s.fullFails))
	fmt.Fprintf(&b, "checks: %d; unknown outcomes resolved: %d; unclear errors: %d; lost: %d\n", s.checks, s.resolved, s.unclear, s.lost)
	return b.String()
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range maps.Keys(m) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
