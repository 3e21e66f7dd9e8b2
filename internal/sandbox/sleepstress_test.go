package sandbox

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestIdleSleepUnderCalls: a sandbox with the shortest idle sleep (1 ms)
// gets execs from four clients, each pausing now and then for longer than
// the lookup grace so that the sandbox sleeps between them. No exec fails
// for a sleep it did not ask for, none hangs, and every line an exec was
// told it wrote is there at the end (across the sleeps and wakes).
func TestIdleSleepUnderCalls(t *testing.T) {
	m := newRealManager(t)
	rec, err := m.Create(t.Context(), CreateRequest{Image: "default", MemoryMiB: 256, Opts: store.Options{IdleSleepMS: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go m.Lifetimes().WatchLifetimes(ctx)
	run := func(cmd string) (string, error) {
		cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer ccancel()
		g, err := m.GuestWaking(cctx, rec.ID)
		if err != nil {
			return "", err
		}
		p, err := g.Exec(cctx, guest.ExecRequest{Argv: []string{"sh", "-c", cmd}})
		if err != nil {
			return "", err
		}
		defer p.Close()
		b, _ := io.ReadAll(p.Stdout)
		st, err := p.Wait(cctx)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("exit %+v", st)
		}
		return string(b), err
	}
	const clients, rounds = 4, 8
	var wg sync.WaitGroup
	written := make([]int, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				out, err := run(fmt.Sprintf("echo %d-%d >> /tmp/log; echo ok", c, r))
				if err != nil || out != "ok\n" {
					t.Errorf("client %d round %d: %q %v", c, r, out, err)
					continue
				}
				written[c]++
				if r%3 == c%3 {
					// Idle for longer than the lookup grace: a sleeper may
					// take the sandbox now (the scenario, not a wait for it).
					time.Sleep(lookupGrace + 200*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	out, err := run("cat /tmp/log")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range written {
		total += n
	}
	if got := len(strings.Fields(out)); got != total {
		t.Errorf("%d lines in the log, want the %d the execs were told they wrote", got, total)
	}
	t.Logf("%d idle sleeps, %d wakes", m.counters.IdleSleeps.Load(), m.counters.Wakes.Load())
}
