package guest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
)

// readAll reads a process's stdout and stderr to their ends.
func readAll(p *guest.Process) (stdout, stderr string, err error) {
	var wg sync.WaitGroup
	var eb strings.Builder
	var eerr error
	wg.Add(1)
	go func() { defer wg.Done(); _, eerr = io.Copy(&eb, p.Stderr) }()
	var ob strings.Builder
	_, err = io.Copy(&ob, p.Stdout)
	wg.Wait()
	if err == nil {
		err = eerr
	}
	return ob.String(), eb.String(), err
}

func findKept(t *testing.T, g *guest.Conn, pid int) *guest.KeptCommand {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kept, err := g.Kept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range kept {
		if kept[i].PID == pid {
			return &kept[i]
		}
	}
	return nil
}

// A kept command survives its host connection's end (a quiesce, as before
// a snapshot): it runs on, is listed with its tag, and an attach gets the
// output that follows what the first caller read, without a gap or a
// repeat, then its exit, which is then collected.
func TestKeptSurvivesQuiesceAndAttachContinues(t *testing.T) {
	g := agentConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 40
	argv := []string{"/bin/sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo $i; i=$((i+1)); sleep 0.05; done; exit 3`, n)}
	p, err := g.Exec(ctx, guest.ExecRequest{Argv: argv, Keep: true, Tag: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	// Read the first lines, then quiesce while it runs.
	var got []string
	sc := bufio.NewScanner(p.Stdout)
	for len(got) < 5 && sc.Scan() {
		got = append(got, sc.Text())
	}
	if len(got) < 5 {
		t.Fatalf("only %q before the end: %v", got, sc.Err())
	}
	if err := g.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	// What the first connection delivered is read to its end.
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if _, err := p.Wait(ctx); err == nil {
		t.Fatal("the quiesced exec ended with an exit; want its connection's error")
	}
	if err := g.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	k := findKept(t, g, pid)
	if k == nil {
		t.Fatalf("pid %d is not listed after the quiesce", pid)
	}
	if k.Tag != "counter" || strings.Join(k.Argv, " ") != strings.Join(argv, " ") || k.StartedMS == 0 {
		t.Fatalf("listed as %+v", *k)
	}
	a, err := g.Attach(ctx, pid, false)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.PID() != pid {
		t.Fatalf("attach pid %d, want %d", a.PID(), pid)
	}
	out, stderr, err := readAll(a)
	if err != nil {
		t.Fatal(err)
	}
	if stderr != "" {
		t.Fatalf("stderr %q", stderr)
	}
	got = append(got, strings.Fields(out)...)
	if len(got) != n {
		t.Fatalf("%d lines in all, want %d: %q", len(got), n, got)
	}
	for i, s := range got {
		if s != strconv.Itoa(i) {
			t.Fatalf("line %d is %q: output not continued where it was (%q)", i, s, got)
		}
	}
	exit, err := a.Wait(ctx)
	if err != nil || exit.Code != 3 {
		t.Fatalf("exit %+v, %v; want code 3", exit, err)
	}
	if k := findKept(t, g, pid); k != nil {
		t.Fatalf("still listed after its exit was collected: %+v", *k)
	}
	if _, err := g.Attach(ctx, pid, false); !errdefs.IsNotFound(err) {
		t.Fatalf("second attach: %v, want not found", err)
	}
}

// Close detaches a kept command rather than killing it; its stdin stays
// open for an attach, which writes to it and ends it.
func TestKeptCloseDetachesAndStdinCarriesOver(t *testing.T) {
	g := agentConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", `read x; echo "got $x"; read y || echo eof; exit 5`}, Stdin: true, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	p.Close()
	k := findKept(t, g, pid)
	if k == nil || k.Exit != nil || !k.Stdin {
		t.Fatalf("after Close: %+v, want it running with its stdin open", k)
	}
	a, err := g.Attach(ctx, pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stdin.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	a.Stdin.Close()
	out, _, err := readAll(a)
	if err != nil {
		t.Fatal(err)
	}
	if out != "got hi\neof\n" {
		t.Fatalf("stdout %q", out)
	}
	if exit, err := a.Wait(ctx); err != nil || exit.Code != 5 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	// A signal through an attach reaches it too.
	p, err = g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sleep", "300"}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	pid = p.PID()
	p.Close()
	a, err = g.Attach(ctx, pid, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exit, err := a.Wait(ctx); err != nil || exit.Signal != int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, %v; want killed", exit, err)
	}
}

// Output made while detached is bounded: the oldest is dropped, and the
// attach is told how much on stderr before the newest wire.KeptBuffer
// bytes.
func TestKeptBufferDropsOldestWithNote(t *testing.T) {
	g := agentConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const total = 1000000
	// It writes once the test says so, after it was detached.
	trigger := filepath.Join(t.TempDir(), "go")
	p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", fmt.Sprintf(`while [ ! -e "$1" ]; do sleep 0.01; done; head -c %d /dev/zero; echo END`, total), "sh", trigger}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	p.Close()
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		k := findKept(t, g, pid)
		if k == nil {
			t.Fatal("forgotten before its exit was collected")
		}
		if k.Exit != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("did not end")
		}
		time.Sleep(20 * time.Millisecond) // polling the agent's state, not ordering
	}
	d, err := g.Attach(ctx, pid, false)
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, err := readAll(d)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^\[clade: (\d+) bytes of this command's output were dropped while no client was attached\]\n$`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("stderr %q, want the note of what was dropped", stderr)
	}
	dropped, _ := strconv.Atoi(m[1])
	if !strings.HasSuffix(out, "END\n") || len(out) > wire.KeptBuffer || dropped+len(out) != total+4 {
		t.Fatalf("%d bytes kept (ending %q) + %d dropped; want at most %d kept and %d in all", len(out), out[max(0, len(out)-8):], dropped, wire.KeptBuffer, total+4)
	}
	if exit, err := d.Wait(ctx); err != nil || exit.Code != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
}

// At most wire.MaxKept kept commands run; one more is refused, not started.
func TestKeptBounded(t *testing.T) {
	g := agentConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ps []*guest.Process
	defer func() {
		for _, p := range ps {
			_ = p.Signal(syscall.SIGKILL)
			_, _ = p.Wait(ctx)
		}
	}()
	for range wire.MaxKept {
		p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sleep", "300"}, Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	p, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sleep", "300"}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait(ctx)
	if err != nil || exit.Code != -1 || exit.ErrorClass != errdefs.ResourceExhausted {
		t.Fatalf("exec past the bound: %+v, %v; want refused as resource_exhausted", exit, err)
	}
	if _, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/true"}, TTY: true, Keep: true}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("kept TTY: %v, want invalid argument", err)
	}
	if _, err := g.Attach(ctx, 999999, false); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to an unknown pid: %v, want not found", err)
	}
}
