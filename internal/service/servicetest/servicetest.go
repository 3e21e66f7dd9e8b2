// Package servicetest is the conformance suite of service.Service: every
// implementation (service/local on the fake engine and on gvisor,
// service/remote over a real daemon) passes the same tests, so that a
// front cannot tell which one it drives.
package servicetest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// Env is what a run of the suite drives.
type Env struct {
	Service service.Service
	// Image is the image sandboxes are created from ("": the default).
	Image string
	// Processes says the sandboxes run real processes: exec output, files
	// and ports are checked. The fake engine's stand-in agent ends every
	// process at once with nothing written, so its run checks the
	// lifecycle, snapshots, sleep and events only; the gvisor and remote
	// runs check everything.
	Processes bool
	// Plain runs the execs that only read their output as the HTTP API
	// does, with service.Plain (a remote service then relays a plain
	// request's frames); a process that is also a service.Frames is then
	// read through NextFrame in testExec.
	Plain bool
}

// execCtx is the context of an exec that only reads its output.
func (e Env) execCtx(t *testing.T) context.Context {
	if e.Plain {
		return service.Plain(t.Context())
	}
	return t.Context()
}

// Run runs the suite; newEnv makes a fresh node per test.
func Run(t *testing.T, newEnv func(t *testing.T) Env) { RunOnly(t, newEnv) }

// RunOnly runs the suite's tests named in names (all of them with none).
func RunOnly(t *testing.T, newEnv func(t *testing.T) Env, names ...string) {
	tests := []struct {
		name      string
		processes bool
		f         func(t *testing.T, e Env)
	}{
		{"Lifecycle", false, testLifecycle},
		{"Refusals", false, testRefusals},
		{"SnapshotFork", false, testSnapshotFork},
		{"SleepWake", false, testSleepWake},
		{"Events", false, testEvents},
		{"Exec", true, testExec},
		{"ExecStdin", true, testExecStdin},
		{"Files", true, testFiles},
		{"Watch", true, testWatch},
		{"Dial", true, testDial},
		{"ForkKeepsState", true, testForkKeepsState},
		{"SleepFiles", true, testSleepFiles},
		{"KeptAcrossSleep", true, testKeptAcrossSleep},
	}
	for _, tc := range tests {
		if len(names) > 0 && !slices.Contains(names, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.processes && !e.Processes {
				// Named in the suite's doc: the fake engine runs no
				// processes; its other runs cover these.
				t.Log("not run: this implementation's sandboxes run no processes (the fake engine)")
				return
			}
			tc.f(t, e)
		})
	}
}

func create(t *testing.T, e Env, name string) api.Sandbox {
	t.Helper()
	sb, err := e.Service.Create(t.Context(), api.CreateSandboxRequest{Image: e.Image, Name: name, MemoryMiB: 128})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = e.Service.Remove(context.WithoutCancel(t.Context()), sb.ID) })
	return sb
}

func testLifecycle(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "suite-one")
	if sb.ID == "" || sb.State != "running" || sb.Name != "suite-one" {
		t.Fatalf("created %+v, want a running sandbox named suite-one", sb)
	}
	for _, ref := range []string{sb.ID, "suite-one"} {
		got, err := e.Service.Get(ctx, ref)
		if err != nil || got.ID != sb.ID {
			t.Fatalf("Get(%s): %+v, %v", ref, got, err)
		}
	}
	list, err := e.Service.List(ctx)
	if err != nil || !slices.ContainsFunc(list, func(s api.Sandbox) bool { return s.ID == sb.ID }) {
		t.Fatalf("List lacks %s: %v", sb.ID, err)
	}
	got, err := e.Service.SetTimeout(ctx, sb.ID, api.TimeoutRequest{TimeoutMS: 3_600_000})
	if err != nil || got.ExpiresAt == nil || time.Until(*got.ExpiresAt) < 50*time.Minute {
		t.Fatalf("SetTimeout: %+v, %v", got, err)
	}
	if st, err := e.Service.Stats(ctx, sb.ID); err != nil && !(errdefs.IsUnavailable(err) && !e.Processes) || err == nil && st.ID != sb.ID {
		t.Fatalf("Stats: %+v, %v", st, err)
	}
	if h, err := e.Service.Health(ctx); err != nil || h.Engine == "" {
		t.Fatalf("Health: %+v, %v", h, err)
	}
	if err := e.Service.Remove(ctx, sb.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := e.Service.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after Remove: %v, want NotFound", err)
	}
}

func testRefusals(t *testing.T, e Env) {
	ctx := t.Context()
	for name, err := range map[string]error{
		"Get":    func() error { _, err := e.Service.Get(ctx, "no-such-sandbox"); return err }(),
		"Remove": e.Service.Remove(ctx, "no-such-sandbox"),
		"Wake":   func() error { _, err := e.Service.Wake(ctx, "no-such-sandbox"); return err }(),
		"SupportsUser": func() error {
			_, err := e.Service.SupportsUser(ctx, "no-such-sandbox", service.Wake)
			return err
		}(),
		"GetSnapshot": func() error {
			_, err := e.Service.GetSnapshot(ctx, "no-such-snapshot")
			return err
		}(),
		"Exec": func() error {
			p, err := e.Service.Exec(ctx, "no-such-sandbox", service.Wake, api.ExecRequest{Cmd: []string{"true"}})
			if err == nil {
				_, err = p.Wait(ctx)
				p.Close()
			}
			return err
		}(),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s of a sandbox that is not there: %v, want NotFound", name, err)
		}
	}
	if _, err := e.Service.Create(ctx, api.CreateSandboxRequest{Image: "no-such-image-here"}); errdefs.ClassOf(err) != errdefs.NotFound {
		t.Errorf("create from a missing image: %v, want NotFound", err)
	}
	if _, err := e.Service.Create(ctx, api.CreateSandboxRequest{Image: e.Image, MemoryMiB: -5}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("create with negative memory: %v, want InvalidArgument", err)
	}
	sb := create(t, e, "")
	if _, err := e.Service.Exec(ctx, sb.ID, service.Wake, api.ExecRequest{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("exec of no command: %v, want InvalidArgument", err)
	}
	if _, err := e.Service.Create(ctx, api.CreateSandboxRequest{Image: e.Image, Name: "dup-name"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Service.Remove(context.WithoutCancel(ctx), "dup-name") })
	if _, err := e.Service.Create(ctx, api.CreateSandboxRequest{Image: e.Image, Name: "dup-name"}); errdefs.ClassOf(err) != errdefs.AlreadyExists && !errdefs.IsConflict(err) {
		t.Errorf("a second sandbox of one name: %v, want AlreadyExists or Conflict", err)
	}
}

func testSnapshotFork(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	sn, err := e.Service.Snapshot(ctx, sb.ID, "suite-snap")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { _ = e.Service.RemoveSnapshot(context.WithoutCancel(ctx), sn.ID) })
	if sn.Sandbox != sb.ID {
		t.Errorf("snapshot of %s names sandbox %s", sb.ID, sn.Sandbox)
	}
	if got, err := e.Service.GetSnapshot(ctx, "suite-snap"); err != nil || got.ID != sn.ID {
		t.Fatalf("GetSnapshot by name: %+v, %v", got, err)
	}
	list, err := e.Service.ListSnapshots(ctx)
	if err != nil || !slices.ContainsFunc(list, func(s api.Snapshot) bool { return s.ID == sn.ID }) {
		t.Fatalf("ListSnapshots lacks %s: %v", sn.ID, err)
	}
	res, err := e.Service.Fork(ctx, sn.ID, 2)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if len(res.Children) != 2 {
		t.Fatalf("fork into 2 made %d children", len(res.Children))
	}
	for _, c := range res.Children {
		if c.Error != "" {
			t.Fatalf("child: %s (%s)", c.Error, c.Code)
		}
		t.Cleanup(func() { _ = e.Service.Remove(context.WithoutCancel(ctx), c.ID) })
		got, err := e.Service.Get(ctx, c.ID)
		if err != nil || got.State != "running" {
			t.Fatalf("child %s: %+v, %v", c.ID, got, err)
		}
		if got.Snapshot != sn.ID {
			t.Errorf("child %s names snapshot %q, want %s", c.ID, got.Snapshot, sn.ID)
		}
	}
	if err := e.Service.RemoveSnapshot(ctx, sn.ID); !errdefs.IsConflict(err) {
		t.Errorf("removing a snapshot its children use: %v, want Conflict", err)
	}
	for _, c := range res.Children {
		if err := e.Service.Remove(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Service.RemoveSnapshot(ctx, sn.ID); err != nil {
		t.Fatalf("RemoveSnapshot once unused: %v", err)
	}
	if _, err := e.Service.Fork(ctx, sb.ID, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("fork into 0: %v, want InvalidArgument", err)
	}
}

func testSleepWake(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	slept, err := e.Service.Sleep(ctx, sb.ID)
	if err != nil || slept.State != "sleeping" {
		t.Fatalf("Sleep: %+v, %v", slept, err)
	}
	// Reads never wake it.
	if got, err := e.Service.Get(ctx, sb.ID); err != nil || got.State != "sleeping" {
		t.Fatalf("Get of a sleeping sandbox: %+v, %v", got, err)
	}
	if _, err := e.Service.List(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Service.Stats(ctx, sb.ID); err != nil && !(errdefs.IsUnavailable(err) && !e.Processes) {
		t.Fatal(err)
	}
	if _, err := e.Service.Exec(ctx, sb.ID, service.NoWake, api.ExecRequest{Cmd: []string{"true"}}); !errdefs.IsConflict(err) {
		t.Errorf("a NoWake exec of a sleeping sandbox: %v, want Conflict", err)
	}
	if _, err := e.Service.Ready(ctx, sb.ID, service.NoWake); !errdefs.IsConflict(err) {
		t.Errorf("a NoWake Ready of a sleeping sandbox: %v, want Conflict", err)
	}
	if got, err := e.Service.Get(ctx, sb.ID); err != nil || got.State != "sleeping" {
		t.Fatalf("after the refused calls: %+v, %v, want still sleeping", got, err)
	}
	woke, err := e.Service.Wake(ctx, sb.ID)
	if err != nil || woke.State != "running" {
		t.Fatalf("Wake: %+v, %v", woke, err)
	}
	// A Wake call of an exec wakes a sleeping one.
	if _, err := e.Service.Sleep(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	p, err := e.Service.Exec(ctx, sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"true"}})
	if err != nil {
		t.Fatalf("a Wake exec of a sleeping sandbox: %v", err)
	}
	drain(p)
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("exec after the wake: %+v, %v", st, err)
	}
	p.Close()
	if got, err := e.Service.Get(ctx, sb.ID); err != nil || got.State != "running" {
		t.Fatalf("after a Wake exec: %+v, %v, want running", got, err)
	}
}

func testEvents(t *testing.T, e Env) {
	ctx := t.Context()
	sub, err := e.Service.SubscribeEvents(ctx, 0, false, service.EventFilter{Labels: map[string]string{"suite": "events"}})
	if err != nil {
		t.Fatalf("SubscribeEvents: %v", err)
	}
	defer sub.Close()
	sb, err := e.Service.Create(ctx, api.CreateSandboxRequest{Image: e.Image, Labels: map[string]string{"suite": "events"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Service.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var seen []string
	timeout := time.After(30 * time.Second)
	events := append([]api.Event(nil), sub.Backlog()...)
	for !slices.Contains(seen, api.EventRemoved) {
		if len(events) == 0 {
			select {
			case ev := <-sub.C():
				events = append(events, ev)
			case <-sub.Done():
				t.Fatalf("the stream ended: %v (seen %v)", sub.Err(), seen)
			case <-timeout:
				t.Fatalf("no removed event for %s (seen %v)", sb.ID, seen)
			}
			continue
		}
		ev := events[0]
		events = events[1:]
		if ev.Sandbox != sb.ID {
			t.Fatalf("the label filter let through %+v", ev)
		}
		seen = append(seen, ev.Type)
	}
	if !slices.Contains(seen, api.EventCreated) {
		t.Errorf("events %v lack created", seen)
	}
	kept, err := e.Service.EventsSince(ctx, 0, service.EventFilter{Sandbox: sb.ID})
	if err != nil || len(kept) < 2 {
		t.Fatalf("EventsSince: %d events, %v", len(kept), err)
	}
}

func drain(p service.Process) (stdout, stderr string) {
	var o, e bytes.Buffer
	done := make(chan struct{})
	go func() { _, _ = io.Copy(&e, p.Stderr()); close(done) }()
	_, _ = io.Copy(&o, p.Stdout())
	<-done
	return o.String(), e.String()
}

// testSleepFiles: a sleep without memory keeps the files but not the
// processes; the sandbox wakes with its agent alone, and runs on.
func testSleepFiles(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	if _, st := run(t, e, sb.ID, "sh", "-c", "echo kept > /root/kept && setsid sleep 901 </dev/null >/dev/null 2>&1 &"); st.Code != 0 {
		t.Fatalf("setup: %+v", st)
	}
	const count = `n=0; for d in /proc/[0-9]*; do c=$(tr '\0' ' ' < $d/cmdline 2>/dev/null); case "$c" in "sleep 901"*) n=$((n+1));; esac; done; echo $n`
	if out, _ := run(t, e, sb.ID, "sh", "-c", count); strings.TrimSpace(out) != "1" {
		t.Fatalf("the process did not start: %q", out)
	}
	slept, err := e.Service.SleepFiles(ctx, sb.ID)
	if err != nil || slept.State != "sleeping" {
		t.Fatalf("SleepFiles: %+v, %v", slept, err)
	}
	woke, err := e.Service.Wake(ctx, sb.ID)
	if err != nil || woke.State != "running" {
		t.Fatalf("Wake: %+v, %v", woke, err)
	}
	if out, _ := run(t, e, sb.ID, "sh", "-c", count); strings.TrimSpace(out) != "0" {
		t.Errorf("after a sleep without memory %q processes survived, want none", out)
	}
	if out, st := run(t, e, sb.ID, "cat", "/root/kept"); st.Code != 0 || out != "kept\n" {
		t.Errorf("the file after a sleep without memory: %q %+v", out, st)
	}
	if _, err := e.Service.SleepFiles(ctx, "no-such-sandbox"); !errdefs.IsNotFound(err) {
		t.Errorf("SleepFiles of a sandbox that does not exist: %v, want NotFound", err)
	}
}

// testKeptAcrossSleep: a kept command (ExecRequest.Keep) outlives a sleep
// with memory: after the wake it is listed with its tag, and an attach
// gets the output that follows what the first caller read, then its exit.
// An implementation that does not serve Kept says so (InvalidArgument),
// and so does one that does not serve it to its caller (Unauthenticated:
// the remote service of a caller that is not a node of the cluster).
func testKeptAcrossSleep(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	const n = 30
	script := fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.1; done; exit 4", n)
	p, err := e.Service.Exec(ctx, sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"sh", "-c", script}, Keep: true, Tag: "counter"})
	if refused := func(err error) bool {
		return errdefs.IsInvalidArgument(err) || errdefs.ClassOf(err) == errdefs.Unauthenticated
	}; refused(err) {
		// Check that it also says so for the other kept calls.
		if _, kerr := e.Service.Kept(ctx, sb.ID, service.NoWake); !refused(kerr) {
			t.Fatalf("Exec refused keep (%v) but Kept answered %v", err, kerr)
		}
		if _, aerr := e.Service.Attach(ctx, sb.ID, service.NoWake, 1, false); !refused(aerr) {
			t.Fatalf("Exec refused keep (%v) but Attach answered %v", err, aerr)
		}
		t.Logf("not served by this implementation: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := e.Service.Kept(ctx, sb.ID, service.NoWake); errdefs.IsInvalidArgument(err) {
		t.Logf("not served by this implementation: %v", err)
		return
	} else if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	var got []string
	sc := bufio.NewScanner(p.Stdout())
	for len(got) < 3 && sc.Scan() {
		got = append(got, sc.Text())
	}
	if _, err := e.Service.Sleep(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if _, err := p.Wait(ctx); err == nil {
		t.Fatal("the exec slept under ended with an exit, want its end unknown")
	}
	if _, err := e.Service.Kept(ctx, sb.ID, service.NoWake); !errdefs.IsConflict(err) {
		t.Errorf("a NoWake Kept of a sleeping sandbox: %v, want Conflict", err)
	}
	kept, err := e.Service.Kept(ctx, sb.ID, service.Wake)
	if err != nil {
		t.Fatal(err)
	}
	var k *api.KeptCommand
	for i := range kept {
		if kept[i].PID == pid {
			k = &kept[i]
		}
	}
	if k == nil || k.Tag != "counter" || strings.Join(k.Cmd, " ") != "sh -c "+script || k.Started.IsZero() {
		t.Fatalf("pid %d after the wake: %+v (of %+v)", pid, k, kept)
	}
	a, err := e.Service.Attach(ctx, sb.ID, service.NoWake, pid, false)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, _ := drain(a)
	got = append(got, strings.Fields(out)...)
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("output across the sleep: %q, want 1..%d once each, in order", got, n)
	}
	if st, err := a.Wait(ctx); err != nil || st.Code != 4 {
		t.Fatalf("exit after the wake: %+v, %v, want 4", st, err)
	}
	if _, err := e.Service.Attach(ctx, sb.ID, service.NoWake, pid, false); !errdefs.IsNotFound(err) {
		t.Errorf("attach after the exit was collected: %v, want NotFound", err)
	}
}

func run(t *testing.T, e Env, id string, argv ...string) (string, api.ExitStatus) {
	t.Helper()
	p, err := e.Service.Exec(e.execCtx(t), id, service.Wake, api.ExecRequest{Cmd: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	defer p.Close()
	out, _ := drain(p)
	st, err := p.Wait(t.Context())
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return out, st
}

func testExec(t *testing.T, e Env) {
	sb := create(t, e, "")
	p, err := e.Service.Exec(e.execCtx(t), sb.ID, service.NoWake, api.ExecRequest{Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Env: []string{"X=1"}})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut := drain(p)
	st, err := p.Wait(t.Context())
	p.Close()
	if err != nil || st.Code != 3 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("exec: code %d out %q err %q (%v)", st.Code, out, errOut, err)
	}
	if e.Plain {
		testExecFrames(t, e, sb.ID)
	}
	if out, _ := run(t, e, sb.ID, "sh", "-c", "echo $HOME"); strings.TrimSpace(out) == "" {
		t.Errorf("no HOME in the exec's environment")
	}
	if ok, err := e.Service.SupportsUser(t.Context(), sb.ID, service.NoWake); err != nil || !ok {
		t.Errorf("SupportsUser of a new sandbox: %v, %v, want true", ok, err)
	}
	// A command that does not start has no pid; Wait says why.
	p, err = e.Service.Exec(e.execCtx(t), sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"/no/such/command"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = drain(p)
	if pid := p.PID(); pid != 0 {
		t.Errorf("a command that did not start has pid %d", pid)
	}
	if st, err := p.Wait(t.Context()); err != nil || st.Error == "" {
		t.Errorf("a command that did not start: %+v, %v, want Error set", st, err)
	}
	p.Close()
	// A process that is closed while it runs is killed; its pid is its
	// own inside the sandbox.
	p, err = e.Service.Exec(e.execCtx(t), sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.PID()
	if comm, _ := run(t, e, sb.ID, "cat", "/proc/"+strconv.Itoa(pid)+"/comm"); pid <= 0 || strings.TrimSpace(comm) != "sleep" {
		t.Errorf("pid %d of a running sleep is %q's", pid, comm)
	}
	p.Close()
	count := `n=0; for c in /proc/[0-9]*/comm; do [ "$(cat $c 2>/dev/null)" = sleep ] && n=$((n+1)); done; echo $n`
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := run(t, e, sb.ID, "sh", "-c", count)
		if strings.TrimSpace(out) == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed process still runs 10 s later: %q sleeps", out)
		}
	}
}

// testExecFrames reads a plain exec's output through service.Frames, if
// the process is one: stdout and stderr frames in the order the command
// wrote them, then the exit; Stdout is then refused.
func testExecFrames(t *testing.T, e Env, id string) {
	p, err := e.Service.Exec(e.execCtx(t), id, service.Wake, api.ExecRequest{Cmd: []string{"sh", "-c", "echo 1; sleep 0.2; echo 2 >&2; sleep 0.2; echo 3; exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fs, ok := p.(service.Frames)
	if !ok {
		t.Log("not run: this implementation's plain process is no service.Frames")
		_, _ = drain(p)
		return
	}
	if p.PID() <= 0 {
		t.Errorf("a started command's pid is %d", p.PID())
	}
	var got []string
	for {
		f, err := fs.NextFrame()
		if err != nil {
			break
		}
		got = append(got, fmt.Sprintf("%d:%s", f.Type, f.Payload))
	}
	want := []string{"4:1\n", "5:2\n", "4:3\n"}
	if !slices.Equal(got, want) {
		t.Errorf("frames %q, want %q (stdout 4, stderr 5, in order)", got, want)
	}
	if st, err := p.Wait(t.Context()); err != nil || st.Code != 4 {
		t.Errorf("exit: %+v %v, want code 4", st, err)
	}
	if _, err := p.Stdout().Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Errorf("Stdout of a process read through NextFrame: %v, want an error", err)
	}
}

func testExecStdin(t *testing.T, e Env) {
	sb := create(t, e, "")
	p, err := e.Service.Exec(t.Context(), sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"tr", "a-z", "A-Z"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go func() {
		_, _ = io.WriteString(p.Stdin(), "hello through stdin\n")
		p.Stdin().Close()
	}()
	out, _ := drain(p)
	if st, err := p.Wait(t.Context()); err != nil || st.Code != 0 || out != "HELLO THROUGH STDIN\n" {
		t.Fatalf("stdin: %q, %+v, %v", out, st, err)
	}
}

// testWatch: a watch sees a file made in a new directory as created and
// written, and its removal; a missing directory is NotFound. A service
// that cannot watch (the remote: the API has no watch) says so with an
// InvalidArgument error naming it "not supported".
func testWatch(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	run(t, e, sb.ID, "mkdir", "-p", "/tmp/w")
	w, err := e.Service.Watch(ctx, sb.ID, service.Wake, "/tmp/w", true)
	if errdefs.IsInvalidArgument(err) && strings.Contains(err.Error(), "not supported") {
		t.Logf("Watch: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	run(t, e, sb.ID, "/bin/sh", "-c", "mkdir /tmp/w/new && echo hi > /tmp/w/new/f && rm /tmp/w/new/f")
	seen := map[string]bool{}
	for !seen["remove new/f"] {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next after %v: %v", seen, err)
		}
		seen[ev.Op+" "+ev.Name] = true
	}
	for _, want := range []string{"create new", "create new/f", "write new/f"} {
		if !seen[want] {
			t.Errorf("no %q among %v", want, seen)
		}
	}
	if _, err := e.Service.Watch(ctx, sb.ID, service.Wake, "/tmp/none", false); !errdefs.IsNotFound(err) {
		t.Errorf("Watch of a missing directory: %v, want NotFound", err)
	}
}

func testFiles(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := strings.Repeat("clade ", 1000)
	_ = tw.WriteHeader(&tar.Header{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "dir/file.txt", Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(body))})
	_, _ = io.WriteString(tw, body)
	tw.Close()
	if err := e.Service.CopyIn(ctx, sb.ID, service.Wake, "/tmp", "", &buf); err != nil {
		t.Fatalf("CopyIn: %v", err)
	}
	if fi, err := e.Service.Stat(ctx, sb.ID, service.Wake, "/tmp/dir"); err != nil || !fi.IsDir {
		t.Fatalf("Stat of the dir: %+v, %v", fi, err)
	}
	if fi, err := e.Service.Stat(ctx, sb.ID, service.Wake, "/tmp/dir/file.txt"); err != nil || fi.IsDir {
		t.Fatalf("Stat of the file: %+v, %v", fi, err)
	}
	if _, err := e.Service.Stat(ctx, sb.ID, service.Wake, "/tmp/no-such-file"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat of a missing path: %v, want NotFound", err)
	}
	rc, err := e.Service.CopyOut(ctx, sb.ID, service.Wake, "/tmp/dir/file.txt")
	if err != nil {
		t.Fatalf("CopyOut: %v", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil || h.Name != "file.txt" || h.Mode&0o777 != 0o640 {
		t.Fatalf("CopyOut's entry: %+v, %v", h, err)
	}
	got, _ := io.ReadAll(tr)
	if string(got) != body {
		t.Fatalf("CopyOut read %d bytes, want %d", len(got), len(body))
	}
	if out, _ := run(t, e, sb.ID, "cat", "/tmp/dir/file.txt"); out != body {
		t.Fatalf("the file inside holds %d bytes, want %d", len(out), len(body))
	}
	if _, err := e.Service.CopyOut(ctx, sb.ID, service.Wake, "/no/such/path"); !errdefs.IsNotFound(err) {
		t.Errorf("CopyOut of a missing path: %v, want NotFound", err)
	}
}

// echoServer is a TCP server that answers each line upper-cased, in the
// default image's python3; it prints "ready" once listening.
const echoServer = `import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8123))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    f = c.makefile("rwb")
    for line in f:
        f.write(line.upper())
        f.flush()
    c.close()
`

func testDial(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	p, err := e.Service.Exec(ctx, sb.ID, service.Wake, api.ExecRequest{Cmd: []string{"python3", "-c", echoServer}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the server in the sandbox: %q, %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	life, err := e.Service.Ready(ctx, sb.ID, service.NoWake)
	if err != nil || life == nil {
		t.Fatalf("Ready: %v, %v", life, err)
	}
	c, err := e.Service.Dial(ctx, sb.ID, service.NoWake, 8123)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "through the service\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "THROUGH THE SERVICE\n" {
		t.Fatalf("over the dialed port: %q, %v", got, err)
	}
	if c2, err := e.Service.Dial(ctx, sb.ID, service.NoWake, 1); err == nil {
		// A port nothing listens on: refused now, or the connection ends.
		_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c2.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("a port nothing listens on answered")
		}
		c2.Close()
	}
}

func testForkKeepsState(t *testing.T, e Env) {
	ctx := t.Context()
	sb := create(t, e, "")
	if _, st := run(t, e, sb.ID, "sh", "-c", "echo parent > /tmp/state"); st.Code != 0 {
		t.Fatalf("write state: %+v", st)
	}
	res, err := e.Service.Fork(ctx, sb.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range res.Children {
		if c.Error != "" {
			t.Fatalf("child %d: %s", i, c.Error)
		}
		t.Cleanup(func() { _ = e.Service.Remove(context.WithoutCancel(ctx), c.ID) })
		if out, _ := run(t, e, c.ID, "cat", "/tmp/state"); out != "parent\n" {
			t.Fatalf("child %d holds %q, want the parent's state", i, out)
		}
		if _, st := run(t, e, c.ID, "sh", "-c", "echo child-"+string(rune('a'+i))+" > /tmp/state"); st.Code != 0 {
			t.Fatal(st)
		}
	}
	for i, c := range res.Children {
		if out, _ := run(t, e, c.ID, "cat", "/tmp/state"); out != "child-"+string(rune('a'+i))+"\n" {
			t.Fatalf("child %d holds %q: the children are not independent", i, out)
		}
	}
	if out, _ := run(t, e, sb.ID, "cat", "/tmp/state"); out != "parent\n" {
		t.Fatalf("the parent holds %q after its children wrote", out)
	}
}
