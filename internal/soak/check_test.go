package soak_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// counterCheck prints "COUNTER a b" with b > a when the counter advances
// (polling for up to 5 s), "COUNTER a a" when it is stuck and "COUNTER
// none" when it was never started.
const counterCheck = `if [ -f /tmp/counter ]; then a=$(cat /tmp/counter); n=0
while [ $n -lt 100 ]; do b=$(cat /tmp/counter); if [ "$b" -gt "$a" ]; then echo "COUNTER $a $b"; exit 0; fi; sleep 0.05; n=$((n+1)); done
echo "COUNTER $a $a"; else echo "COUNTER none"; fi`

// check compares the daemon with the model: every acknowledged sandbox
// exists, running or sleeping, with its files whole and its counter
// advancing; every acknowledged snapshot exists; whatever was in flight at
// a crash is there whole or not at all. Call it with the gate held
// exclusively (no client operation runs).
func (s *soak) check(reason string) {
	start := time.Now()
	s.stats.mu.Lock()
	s.stats.checks++
	s.stats.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := s.client.Load()
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	resolved := 0

	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		s.t.Errorf("%s: list sandboxes: %v", reason, err)
		return
	}
	// A restart on a full disk cannot record how some sandboxes came out
	// (they show e.g. waking); the daemon retries every 2 s until it can.
	// With room again, give it the time to.
	for deadline := time.Now().Add(30 * time.Second); !s.diskFull.Load() && anyInBetween(sbs) && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond) // polling the daemon's retry
		if sbs, err = c.ListSandboxes(ctx); err != nil {
			s.t.Errorf("%s: list sandboxes: %v", reason, err)
			return
		}
	}
	byID, byName := map[string]sdk.Sandbox{}, map[string]sdk.Sandbox{}
	for _, sb := range sbs {
		byID[sb.ID] = sb
		if sb.Name != "" {
			byName[sb.Name] = sb
		}
	}
	// Creates in flight at a crash: there whole, or not at all.
	for _, name := range sortedKeys(m.pendingCreates) {
		got, found := byName[name]
		if found && got.State == "creating" {
			// Not whole yet: a restart on a full disk could not record its
			// rollback; the next check with room decides.
			continue
		}
		if found {
			m.sbs[got.ID] = &sbox{id: got.ID, name: name, files: map[string]string{}, maybe: map[string]string{}}
		}
		delete(m.pendingCreates, name)
		resolved++
	}
	for _, id := range sortedKeys(m.sbs) {
		sb := m.sbs[id]
		got, found := byID[id]
		switch {
		case !found && sb.maybeGone:
			delete(m.sbs, id)
			resolved++
			continue
		case !found:
			s.finding(true, "%s: sandbox %s (%s) was acknowledged and is gone", reason, id, sb.name)
			delete(m.sbs, id)
			continue
		case sb.maybeGone && got.State == "destroying":
			// The remove began and was recorded: the sandbox must go
			// (a full disk may hold its last step up until there is room).
			if !s.diskFull.Load() {
				s.finding(false, "%s: sandbox %s: a remove cut short by a crash is still destroying (error %q) after a start with room", reason, id, got.Error)
			}
			continue
		case sb.maybeGone:
			sb.maybeGone = false // the remove did not happen: it must be whole
			resolved++
		}
		if inBetween(got.State) && s.diskFull.Load() {
			s.t.Logf("%s: sandbox %s is %s while the disk is full: checked at the next check with room", reason, id, got.State)
			continue
		}
		if got.State != "running" && got.State != "sleeping" {
			s.finding(true, "%s: sandbox %s is %s (error %q), want running or sleeping", reason, id, got.State, got.Error)
			delete(m.sbs, id)
			continue
		}
		if sb.state != "" && got.State != sb.state {
			s.finding(false, "%s: sandbox %s is %s, but the clients were told %s", reason, id, got.State, sb.state)
		}
		resolved += s.checkSandbox(ctx, c, sb, reason)
	}
	// Sandboxes nobody was told of: children of a fork in flight at a
	// crash may exist, whole; anything else is a leak.
	for _, got := range sbs {
		if _, known := m.sbs[got.ID]; known {
			continue
		}
		switch {
		case m.pendingCreates[got.Name] && got.State == "creating":
			continue // a create in flight at a crash, not settled yet (above)
		case got.State == "destroying" && s.diskFull.Load():
			continue // removed, its record deleted once there is room
		case m.deferred[got.ID] && !s.restartedFree:
			// A build's sandbox the daemon could not reap on a full disk:
			// the next start with space must.
			continue
		case m.deferred[got.ID]:
			s.finding(false, "%s: sandbox %s of a build in flight at a crash was not reaped by a restart with free space", reason, got.ID)
		case m.unknownBuilds > 0 && s.diskFull.Load():
			s.t.Logf("%s: sandbox %s (%q, %s): a build's in flight at a crash, not reaped as the disk is full; the next start with space must", reason, got.ID, got.Name, got.State)
			m.deferred[got.ID] = true
			continue
		case m.strays[got.ID]:
			// Reported already; its removal failed (a full disk).
		case m.failedBuilds > 0 && s.diskFull.Load():
			s.t.Logf("%s: sandbox %s (%q, %s): a failed build's, whose removal the full disk refused; it must go once there is room", reason, got.ID, got.Name, got.State)
			continue
		case m.failedBuilds > 0 && s.goneSoon(ctx, c, got.ID):
			// A failed build's, removed once the disk had room.
			resolved++
			continue
		case m.unknownForks == 0:
			s.finding(false, "%s: sandbox %s (%q, %s, image %s) that no client was told of (builds in flight at a crash: %d)",
				reason, got.ID, got.Name, got.State, got.Image, m.unknownBuilds)
		default:
			resolved++
			st, err := c.Exec(ctx, got.ID, sdk.ExecRequest{Cmd: []string{"true"}})
			if err != nil || st.Code != 0 {
				s.finding(false, "%s: sandbox %s of a fork in flight at a crash is not whole: %s, exec: %+v %v", reason, got.ID, got.State, st, err)
			}
		}
		m.strays[got.ID] = true
		if err := c.DeleteSandbox(ctx, got.ID); err != nil && !sdk.IsNotFound(err) {
			if !s.diskFull.Load() {
				s.t.Errorf("%s: remove unknown sandbox %s: %v", reason, got.ID, err)
			}
		} else {
			delete(m.strays, got.ID)
		}
	}
	for id := range m.deferred {
		if _, there := byID[id]; !there {
			delete(m.deferred, id)
		}
	}
	m.unknownForks, m.unknownBuilds = 0, 0
	if !s.diskFull.Load() {
		m.failedBuilds = 0
	}
	s.restartedFree = false

	snaps, err := c.ListSnapshots(ctx)
	if err != nil {
		s.t.Errorf("%s: list snapshots: %v", reason, err)
		return
	}
	snapByID, snapByName := map[string]sdk.Snapshot{}, map[string]sdk.Snapshot{}
	for _, sn := range snaps {
		snapByID[sn.ID] = sn
		if sn.Name != "" {
			snapByName[sn.Name] = sn
		}
	}
	for _, name := range sortedKeys(m.pendingSnaps) {
		if got, found := snapByName[name]; found {
			p := m.pendingSnaps[name]
			p.id = got.ID
			m.snaps[got.ID] = p
		}
		delete(m.pendingSnaps, name)
		resolved++
	}
	for _, id := range sortedKeys(m.snaps) {
		sn := m.snaps[id]
		_, found := snapByID[id]
		switch {
		case !found && (sn.maybeGone || sn.implicit):
			// An implicit snapshot goes with its last child.
			delete(m.snaps, id)
		case !found:
			s.finding(true, "%s: snapshot %s (%s) was acknowledged and is gone", reason, id, sn.name)
			delete(m.snaps, id)
		default:
			sn.maybeGone = false
		}
	}
	for _, got := range snaps {
		if _, known := m.snaps[got.ID]; !known {
			s.finding(false, "%s: snapshot %s (%q, implicit %v, used by %v) that no client was told of", reason, got.ID, got.Name, got.Implicit, got.UsedBy)
		}
	}
	s.stats.mu.Lock()
	s.stats.resolved += resolved
	s.stats.mu.Unlock()
	s.t.Logf("check %s: %d sandboxes, %d snapshots, %d unknown outcomes resolved, %s", reason, len(m.sbs), len(m.snaps), resolved, time.Since(start).Round(time.Millisecond))
}

// checkSandbox checks one sandbox's files and counter with one exec (which
// wakes it if it sleeps). It returns the number of unknown outcomes it
// resolved. Call with the model locked.
func (s *soak) checkSandbox(ctx context.Context, c *sdk.Client, sb *sbox, reason string) int {
	paths := sortedKeys(sb.files)
	for _, p := range sortedKeys(sb.maybe) {
		if _, dup := sb.files[p]; !dup {
			paths = append(paths, p)
		}
	}
	script := `cd /; for f in ` + strings.Join(paths, " ") + `; do if [ -f "$f" ]; then sha256sum "$f"; else echo "MISSING $f"; fi; done
` + counterCheck
	var stdout, stderr bytes.Buffer
	st, err := c.Exec(ctx, sb.id, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &stdout, Stderr: &stderr})
	var se *sdk.Error
	if err != nil && s.diskFull.Load() && errors.As(err, &se) {
		// A wake (or a reconnect) refused on a full disk: the data is
		// checked once there is space again (and the sandbox must be
		// there then). The refusal should say so, retryably.
		if se.Code == "internal" {
			s.stats.mu.Lock()
			s.stats.unclear++
			s.stats.mu.Unlock()
		}
		s.t.Logf("%s: sandbox %s not checked while the disk is full: %v", reason, sb.id, err)
		return 0
	}
	if err != nil || st.Code != 0 {
		s.finding(true, "%s: sandbox %s: the check's exec failed: %+v %v\n%s", reason, sb.id, st, err, stderr.String())
		return 0
	}
	sb.state = "running"
	got := map[string]string{}
	counter := ""
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		switch f := strings.Fields(line); {
		case len(f) == 2 && f[0] == "MISSING":
			got[f[1]] = "missing"
		case len(f) >= 2 && f[0] == "COUNTER":
			counter = strings.Join(f[1:], " ")
		case len(f) == 2:
			got[f[1]] = f[0]
		default:
			s.t.Errorf("%s: sandbox %s: unexpected check output %q", reason, sb.id, line)
		}
	}
	resolved := 0
	for _, p := range sortedKeys(sb.files) {
		if got[p] != sb.files[p] {
			s.finding(true, "%s: sandbox %s: acknowledged file %s is %s, want sha256 %s", reason, sb.id, p, got[p], sb.files[p])
			delete(sb.files, p) // reported once
		}
	}
	for _, p := range sortedKeys(sb.maybe) {
		resolved++
		switch got[p] {
		case "missing":
		case sb.maybe[p]:
			sb.files[p] = sb.maybe[p]
		default:
			s.finding(false, "%s: sandbox %s: %s, written by an upload that failed or was in flight at a crash, is half there: sha256 %s, want %s or no file",
				reason, sb.id, p, got[p], sb.maybe[p])
		}
		delete(sb.maybe, p)
	}
	v := judgeCounter(sb.counter, sb.lastCount, counter)
	switch {
	case v.unparsed:
		s.t.Errorf("%s: sandbox %s: counter check said %q", reason, sb.id, counter)
	case v.lost != "":
		s.finding(true, "%s: sandbox %s: %s", reason, sb.id, v.lost)
	case v.resolved:
		resolved++
	}
	sb.counter, sb.lastCount = v.counter, v.lastCount
	return resolved
}

// counterVerdict is what a check makes of a sandbox's counter.
type counterVerdict struct {
	// counter and lastCount are the sandbox's (sbox) from now on.
	counter, lastCount int
	// resolved: an unknown outcome (a start in flight at a crash) is
	// settled; lost says what acknowledged was lost; unparsed: the check's
	// output made no sense.
	resolved bool
	lost     string
	unparsed bool
}

// judgeCounter judges the check's counter output seen ("none", or two
// readings "a b": b > a when the counter advances) against the sandbox's
// expected counter (0 none runs, 1 one runs, 2 one may: its start was in
// flight at a crash) and the highest value seen before, last.
//
// A start in flight at a crash may have left a counter file that no
// longer advances: the agent kills an exec's process group (the counter
// started in its background with it) when the daemon's connection breaks
// (closeAll), so "started, then killed with its exec" is one of the
// outcomes of a start nobody acknowledged, not a loss. A counter known not
// to run (0) stays so however often a check sees its stuck file.
func judgeCounter(want, last int, seen string) counterVerdict {
	v := counterVerdict{counter: want, lastCount: last}
	var a, b int
	switch n, _ := fmt.Sscanf(seen, "%d %d", &a, &b); {
	case seen == "none" && want == 1:
		v.lost, v.counter = "its counter file is gone", 0
	case seen == "none":
		v.resolved, v.counter = want == 2, 0
	case n != 2:
		v.unparsed = true
	case b <= a && want == 1:
		v.lost, v.counter = fmt.Sprintf("its counter process is not running (stuck at %d)", a), 0
	case a < last:
		v.lost, v.lastCount = fmt.Sprintf("its counter went back from %d to %d (an old state came back)", last, a), b
	case b <= a:
		// Not running, as known (0), or as a start cut short may leave it (2).
		v.resolved, v.counter, v.lastCount = want == 2, 0, max(last, a)
	default:
		v.resolved, v.counter, v.lastCount = want == 2, 1, b
	}
	return v
}

// inBetween says whether a sandbox's state is one between two others.
func inBetween(state string) bool {
	switch state {
	case "creating", "destroying", "suspending", "waking":
		return true
	}
	return false
}

// anyInBetween says whether a listed sandbox is in a state in between.
func anyInBetween(sbs []sdk.Sandbox) bool {
	for _, sb := range sbs {
		if inBetween(sb.State) {
			return true
		}
	}
	return false
}

// goneSoon says whether sandbox id is removed within half a minute: the
// daemon retries the removal of a failed build's sandbox every 2 s once a
// full disk has room.
func (s *soak) goneSoon(ctx context.Context, c *sdk.Client, id string) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.GetSandbox(ctx, id); sdk.IsNotFound(err) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond): // polling for the daemon's retry
		}
	}
	return false
}
