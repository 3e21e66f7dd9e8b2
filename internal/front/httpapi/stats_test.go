package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestStats reads a real sandbox's use: memory grows by what a process in
// it allocates, pids counts a background process, a sleeping sandbox is
// read without waking it.
func TestStats(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{MemoryMiB: 512})

	before, err := c.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if before.State != "running" || before.MemoryBytes == 0 || before.CPUNanos == 0 || before.Pids < 1 ||
		before.MemoryLimitBytes != 512<<20 || before.CPUs != sb.CPUs {
		t.Fatalf("stats of a fresh sandbox: %+v", before)
	}

	// A background process counts.
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "sleep 600 >/dev/null 2>&1 &"}}); r.err != nil || r.st.Code != 0 {
		t.Fatalf("start background process: %+v", r)
	}
	withBg, err := c.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if withBg.Pids != before.Pids+1 {
		t.Fatalf("pids %d after starting a background process, want %d", withBg.Pids, before.Pids+1)
	}

	// 128 MiB allocated and touched by a process that says when it is done
	// and then waits to be killed.
	const alloc = 128 << 20
	pr, pw := io.Pipe()
	execCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(execCtx, sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c",
			"import sys, time\nx = bytearray(b'\\x01') * (128 << 20)\nprint('ready', flush=True)\ntime.sleep(600)"}, Stdout: pw})
		pw.CloseWithError(err)
		done <- err
	}()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	if line, err := bufio.NewReader(pr).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("allocating process said %q, %v", line, err)
	}
	after, err := c.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if grown := int64(after.MemoryBytes) - int64(withBg.MemoryBytes); grown < alloc*9/10 {
		t.Fatalf("memory grew by %d bytes (%d -> %d) after allocating %d in the sandbox", grown, withBg.MemoryBytes, after.MemoryBytes, alloc)
	}
	if after.CPUNanos <= before.CPUNanos || !after.ReadAt.After(before.ReadAt) {
		t.Fatalf("cpu time did not advance: %+v then %+v", before, after)
	}
	if p := sdk.CPUPercent(before, after); p <= 0 {
		t.Fatalf("CPUPercent = %v over a reading where python ran", p)
	}
	stop()

	// The list form, by id and in full; a sleeping sandbox has only its state.
	other := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "stats-other"})
	if _, err := c.Sleep(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	all, err := c.StatsList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("StatsList() has %d readings, want 2: %+v", len(all), all)
	}
	some, err := c.StatsList(ctx, "stats-other", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(some) != 2 || some[0].ID != other.ID || some[1].ID != sb.ID {
		t.Fatalf("StatsList(stats-other, %s) = %+v", sb.ID, some)
	}
	if s := some[0]; s.State != "sleeping" || s.MemoryBytes != 0 || s.Pids != 0 || s.Name != "stats-other" {
		t.Fatalf("reading of a sleeping sandbox: %+v", s)
	}
	if s := some[1]; s.State != "running" || s.MemoryBytes == 0 {
		t.Fatalf("reading of a running sandbox in the list: %+v", s)
	}
	if got, err := c.GetSandbox(ctx, other.ID); err != nil || got.State != "sleeping" {
		t.Fatalf("after reading its stats the sleeping sandbox is %q (%v), want still sleeping", got.State, err)
	}

	// A woken sandbox may run in another engine sandbox than its id: it is
	// read there.
	if _, err := c.Wake(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Stats(ctx, "stats-other"); err != nil || s.State != "running" || s.MemoryBytes == 0 || s.Pids < 1 {
		t.Fatalf("reading of a woken sandbox: %+v, %v", s, err)
	}

	if _, err := c.Stats(ctx, "no-such-sandbox"); !sdk.IsNotFound(err) {
		t.Fatalf("Stats(unknown) = %v, want not found", err)
	}
	if _, err := c.StatsList(ctx, sb.ID, "no-such-sandbox"); !sdk.IsNotFound(err) {
		t.Fatalf("StatsList(unknown) = %v, want not found", err)
	}
}
