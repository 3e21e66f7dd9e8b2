package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// impostor is a program any process in a sandbox can run (every one is
// root there): it dials the agent's socket and pretends to be the agent.
// "stop" first stops the real agent (kill -STOP 1), says hello as the
// agent would without its key, and answers every Open with Started twice
// (which panicked the daemon); it resumes the agent when the host hangs
// up. "hellos" tries one hello after another (none, no key, a wrong key,
// garbage) and says what each got. Either prints "refused" for a
// connection the host closed before it opened anything.
const impostor = `
import base64, json, os, signal, socket, struct, sys

def frame(t, ch, p):
    return struct.pack('>BII', t, ch, len(p)) + p

def recvall(s, n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b

def hello(key=None):
    h = {"version": 1, "pid": 1, "boot": 9, "features": ["pty", "secret-env", "auth"]}
    if key is not None:
        h["key"] = base64.b64encode(key).decode()
    return frame(1, 0, json.dumps(h).encode())

def attempt(first):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect('/.clade/run/agent.sock')
    s.settimeout(15)
    s.sendall(first)
    try:
        while True:
            t, ch, n = struct.unpack('>BII', recvall(s, 9))
            p = recvall(s, n)
            if t == 2:  # Open
                s.sendall(frame(3, ch, b'{"pid":5}') * 2)
                return 'answered an open'
            if t == 10:  # Ping
                s.sendall(frame(11, ch, p))
            if t == 15:  # Key
                return 'handed a key'
    except (EOFError, ConnectionResetError, BrokenPipeError):
        return 'refused'
    except socket.timeout:
        return 'kept waiting'

mode = sys.argv[1]
if mode == 'stop':
    os.kill(1, signal.SIGSTOP)
    try:
        print(attempt(hello()), flush=True)
    finally:
        os.kill(1, signal.SIGCONT)
    print('done', flush=True)
else:
    for name, first in [('no key', hello()), ('wrong key', hello(b'k' * 32)),
                        ('garbage', b'\xff' * 64), ('started first', frame(3, 1, b'{"pid":1}'))]:
        print(name + ': ' + attempt(first), flush=True)
    try:
        open('/proc/1/mem', 'rb').read(1)
        print('read the agent memory', flush=True)
    except OSError as e:
        print('agent memory: ' + type(e).__name__, flush=True)
`

// run execs argv in sb and returns its output (stdout then stderr).
func run(t *testing.T, g *guest.Conn, argv ...string) string {
	t.Helper()
	out, err := tryRun(t, g, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryRun is run that returns what fails.
func tryRun(t *testing.T, g *guest.Conn, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := g.Exec(ctx, guest.ExecRequest{Argv: argv})
	if err != nil {
		return "", fmt.Errorf("exec %q: %w", argv[0], err)
	}
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = io.Copy(&errOut, p.Stderr) }()
	_, _ = io.Copy(&out, p.Stdout)
	wg.Wait()
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		return "", fmt.Errorf("exec %q: %+v, %v: %s%s", argv[0], st, err, out.String(), errOut.String())
	}
	return out.String() + errOut.String(), nil
}

// syncBuffer is a log sink for several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestImpostorInSandbox: a process in a sandbox dials the agent's socket
// and pretends to be the agent, with the real one stopped or not. The
// daemon (this test's process) survives, the impostor is refused and
// logged, and the sandbox's and another sandbox's agents keep serving.
func TestImpostorInSandbox(t *testing.T) {
	dir := testenv.TempDir(t)
	_, agent := testenv.Binaries(t)
	var logs syncBuffer
	e, err := New(Config{StateDir: dir, Runsc: testenv.Runsc(t), AgentPath: agent,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(testenv.ImagesDir(t), "default", "rootfs")
	var sbs []engine.Sandbox
	for _, id := range []string{"impostor00000001", "impostor00000002"} {
		spec := engine.Spec{ID: id, RootFS: rootfs, MemoryMiB: 128}
		sb, err := e.Create(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Destroy(context.Background(), id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		})
		sbs = append(sbs, sb)
	}
	g, other := sbs[0].Guest(), sbs[1].Guest()

	t.Run("hellos", func(t *testing.T) {
		out := run(t, g, "python3", "-c", impostor, "hellos")
		for _, want := range []string{"no key: refused", "wrong key: refused", "garbage: refused",
			"started first: refused", "agent memory: PermissionError"} {
			if !strings.Contains(out, want) {
				t.Errorf("impostor said %q, want %q in it", out, want)
			}
		}
		if got := run(t, g, "echo", "still the agent"); got != "still the agent\n" {
			t.Fatalf("exec after the impostor: %q", got)
		}
	})

	t.Run("stopped agent, started twice", func(t *testing.T) {
		// Detached: while it runs the agent is stopped.
		run(t, g, "sh", "-c", `setsid python3 -c "$1" stop >/tmp/impostor.log 2>&1 </dev/null &`, "sh", impostor)
		// Calls wait while the agent is stopped; an old host handed this
		// one to the impostor, whose answer panicked it.
		var out string
		var err error
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out, "done") {
			if time.Now().After(deadline) {
				t.Fatalf("the impostor did not finish: %q, %v", out, err)
			}
			// A call may fail while the impostor holds the connection
			// (an old host let it): the next one goes to the impostor.
			out, err = tryRun(t, g, "cat", "/tmp/impostor.log")
		}
		if !strings.Contains(out, "refused") {
			t.Fatalf("impostor said %q, want it refused", out)
		}
		if got := run(t, g, "echo", "still the agent"); got != "still the agent\n" {
			t.Fatalf("exec after the impostor: %q", got)
		}
	})

	if got := run(t, other, "echo", "ok"); got != "ok\n" {
		t.Fatalf("the other sandbox's exec: %q", got)
	}
	if !strings.Contains(logs.String(), "not the agent's") {
		t.Fatalf("no refusal logged; log:\n%s", logs.String())
	}
}
