package httpapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestMain: the tests (and crash-point subtests) with a daemon of their own
// (its data dir, socket, network share and, if any, TCP port) run in
// parallel, two at a time (go test's -parallel on two cores): most of their
// time is waiting on boots, restores, restarts and dead-peer timers. Run
// one by one, as they did, the package took 5-10 minutes of `make test`.
// Sequential still, so that no other test's load is beside them: those
// that bound an elapsed time (TestRestartWithAFrozenAgent,
// TestCorruptStateImages, TestAgentAsInit), and those that write into the
// images directory every daemon shares (the image pull, import, build and
// build-cleanup tests).
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	st             sdk.ExitStatus
	err            error
}

func run(t *testing.T, c *sdk.Client, id string, req sdk.ExecRequest) result {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	st, err := c.Exec(t.Context(), id, req)
	return result{out.String(), errb.String(), st, err}
}

func newSandbox(t *testing.T, c *sdk.Client, req sdk.CreateSandboxRequest) sdk.Sandbox {
	t.Helper()
	sb, err := c.CreateSandbox(t.Context(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func TestExec(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Env: []string{"BASE=from-create"}})

	tests := []struct {
		name               string
		req                sdk.ExecRequest
		stdout, stderr     string
		code, signal       int
		timedOut, errorSet bool
	}{
		{name: "exit code", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "exit 42"}}, code: 42},
		{name: "separate stderr", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo out; echo err >&2"}}, stdout: "out\n", stderr: "err\n"},
		{name: "not found", req: sdk.ExecRequest{Cmd: []string{"no-such-command"}}, code: 127, errorSet: true},
		{name: "signal", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "kill -TERM $$"}}, code: 128 + 15, signal: 15},
		{name: "env", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo $BASE $EXTRA"}, Env: []string{"EXTRA=from-exec"}}, stdout: "from-create from-exec\n"},
		{name: "env overrides", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo $BASE"}, Env: []string{"BASE=over"}}, stdout: "over\n"},
		{name: "workdir", req: sdk.ExecRequest{Cmd: []string{"pwd"}, Workdir: "/usr/lib"}, stdout: "/usr/lib\n"},
		{name: "default workdir", req: sdk.ExecRequest{Cmd: []string{"pwd"}}, stdout: "/\n"},
		{name: "missing workdir", req: sdk.ExecRequest{Cmd: []string{"pwd"}, Workdir: "/nope"}, code: 126, errorSet: true},
		{name: "stdin", req: sdk.ExecRequest{Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done"}, Stdin: strings.NewReader("hello\nworld\n")}, stdout: "HELLO\nWORLD\ndone\n"},
		{name: "python", req: sdk.ExecRequest{Cmd: []string{"python3", "-c", "print(6*7)"}}, stdout: "42\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, c, sb.ID, tc.req)
			if r.err != nil {
				t.Fatalf("exec: %v", r.err)
			}
			if r.stdout != tc.stdout || r.st.Code != tc.code || r.st.Signal != tc.signal || (r.st.Error != "") != tc.errorSet {
				t.Fatalf("got stdout %q stderr %q status %+v; want stdout %q code %d signal %d error set %v",
					r.stdout, r.stderr, r.st, tc.stdout, tc.code, tc.signal, tc.errorSet)
			}
			if tc.stderr != "" && r.stderr != tc.stderr {
				t.Fatalf("stderr %q, want %q", r.stderr, tc.stderr)
			}
		})
	}

	t.Run("large binary output", func(t *testing.T) {
		// 40 MiB of pseudo-random bytes: every byte value, no text framing.
		const size = 40 << 20
		h := sha256.New()
		var errb bytes.Buffer
		st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{
			Cmd:    []string{"python3", "-c", fmt.Sprintf("import sys, random, hashlib\nr = random.Random(7)\nb = r.randbytes(%d)\nsys.stdout.buffer.write(b)\nsys.stderr.write(hashlib.sha256(b).hexdigest())", size)},
			Stdout: h, Stderr: &errb})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %v %+v %s", err, st, errb.String())
		}
		if got := fmt.Sprintf("%x", h.Sum(nil)); got != errb.String() {
			t.Fatalf("stdout sha256 %s, the sandbox wrote %s", got, errb.String())
		}
	})

	t.Run("large stdin", func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), 1<<20) // 18 MiB
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "sha256sum | cut -d' ' -f1"}, Stdin: bytes.NewReader(data)})
		if want := fmt.Sprintf("%x\n", sha256.Sum256(data)); r.err != nil || r.stdout != want {
			t.Fatalf("got %q (%v), want %q", r.stdout, r.err, want)
		}
	})

	t.Run("timeout kills the process tree", func(t *testing.T) {
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1000 & echo $! > /tmp/child; sleep 1000"}, Timeout: 300 * time.Millisecond})
		if r.err != nil || !r.st.TimedOut || r.st.Code != 137 {
			t.Fatalf("got %+v %v, want timed out with code 137", r.st, r.err)
		}
		chk := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo dead"}})
		if chk.stdout != "dead\n" {
			t.Fatalf("background child of a timed-out command is %q", chk.stdout)
		}
	})

	t.Run("signal forwarding", func(t *testing.T) {
		sigs := make(chan os.Signal, 1)
		var out bytes.Buffer
		pr, pw := io.Pipe()
		defer pw.Close()
		done := make(chan result, 1)
		go func() {
			st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done"},
				Stdin: pr, Stdout: &syncWriter{w: &out, onWrite: func(s string) {
					if strings.Contains(s, "ready") {
						sigs <- syscall.SIGINT
					}
				}}, Signals: sigs})
			done <- result{st: st, err: err}
		}()
		r := <-done
		if r.err != nil || r.st.Code != 5 || !strings.Contains(out.String(), "got-int") {
			t.Fatalf("got %+v %v output %q; want the trap to run and exit 5", r.st, r.err, out.String())
		}
	})

	t.Run("cancel kills the command", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		started := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo $$ > /tmp/cancelled; echo go; sleep 1000"},
				Stdout: &syncWriter{w: io.Discard, onWrite: func(string) { close(started) }}})
			errc <- err
		}()
		<-started
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("exec returned no error after its context was cancelled")
		}
		// The sandbox's agent kills the process once the daemon sees the
		// client go; wait for that by asking until it is gone.
		deadline := time.Now().Add(time.Minute)
		for {
			chk := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "kill -0 $(cat /tmp/cancelled) 2>/dev/null && echo alive || echo dead"}})
			if chk.stdout == "dead\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command of a cancelled exec is still running")
			}
		}
	})

	t.Run("50 concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out bytes.Buffer
				st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero | wc -c; exit %d", 1000*i, i%7)}, Stdout: &out})
				if err != nil || st.Code != i%7 || strings.TrimSpace(out.String()) != fmt.Sprint(1000*i) {
					errs <- fmt.Errorf("exec %d: %v code %d out %q", i, err, st.Code, out.String())
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// syncWriter calls onWrite for every write, under a lock.
type syncWriter struct {
	mu      sync.Mutex
	w       io.Writer
	onWrite func(string)
	called  bool
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.called {
		s.called = true
		s.onWrite(string(p))
	}
	return s.w.Write(p)
}

func TestAPIErrors(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Name: "named"})

	// Errors through the SDK.
	if _, err := c.GetSandbox(t.Context(), "0123456789abcdef"); !sdk.IsNotFound(err) {
		t.Errorf("get unknown id: %v, want not found", err)
	}
	if err := c.DeleteSandbox(t.Context(), "nope"); !sdk.IsNotFound(err) {
		t.Errorf("delete unknown: %v, want not found", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{MemoryMiB: 1}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("create with 1 MiB: %v, want invalid argument about memory", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Image: "no-such-image"}); !sdk.IsNotFound(err) || !strings.Contains(err.Error(), "clade image pull no-such-image") {
		t.Errorf("create with unknown image: %v, want not found saying how to pull it", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "named"}); !sdk.IsConflict(err) {
		t.Errorf("create with a taken name: %v, want conflict", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "bad/name"}); !sdk.IsInvalidArgument(err) {
		t.Errorf("create with a bad name: %v, want invalid argument", err)
	}
	if got, err := c.GetSandbox(t.Context(), "named"); err != nil || got.ID != sb.ID {
		t.Errorf("get by name: %+v %v, want %s", got, err, sb.ID)
	}
	if _, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{}); !sdk.IsInvalidArgument(err) {
		t.Errorf("exec with no command: %v, want invalid argument", err)
	}
	for _, p := range []string{"relative/path", "/etc/../../root", ""} {
		if _, err := c.CopyFrom(t.Context(), sb.ID, p); !sdk.IsInvalidArgument(err) {
			t.Errorf("copy from %q: %v, want invalid argument", p, err)
		}
		if err := c.CopyTo(t.Context(), sb.ID, p, strings.NewReader("")); !sdk.IsInvalidArgument(err) {
			t.Errorf("copy to %q: %v, want invalid argument", p, err)
		}
	}
	if _, err := c.CopyFrom(t.Context(), sb.ID, "/no/such/file"); !sdk.IsNotFound(err) {
		t.Errorf("copy from a missing path: %v, want not found", err)
	}

	// Raw HTTP: malformed bodies get a 400 with a JSON message.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.Socket)
	}}}
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/sandboxes", "{not json", 400},
		{"POST", "/v1/sandboxes", `{"memory_mib": "lots"}`, 400},
		{"POST", "/v1/sandboxes", `{"unknown_field": 1}`, 400},
		{"POST", "/v1/sandboxes", `{"env": ["NOEQUALS"]}`, 400},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd": []}`, 400},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd": ["cat"], "stdin": true}`, 400},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd": ["true"], "keep": true}`, 400},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd": ["true"], "tag": "x"}`, 400},
		{"GET", "/v1/sandboxes/" + strings.Repeat("x", 300), "", 404},
		{"GET", "/v2/nothing", "", 404},
	} {
		req, _ := http.NewRequest(tc.method, "http://clade"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !bytes.Contains(b, []byte(`"message"`)) {
			t.Errorf("%s %s %q: %d %s, want %d with a message", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.status)
		}
	}
	// The daemon is still healthy after all of it.
	if _, err := c.Health(t.Context()); err != nil {
		t.Fatalf("daemon unhealthy after bad input: %v", err)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
