package httpapi_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func rawClient(d *testenv.Daemon) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.Socket)
	}}}
}

// TestExecInputLimits: exec timeouts and env entries are validated with a
// 400 naming the limit, never rounded, overflowed or failed in execve.
func TestExecInputLimits(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	big := "BIG=" + strings.Repeat("x", 1000<<10)

	// The SDK refuses what it cannot send exactly.
	for _, to := range []time.Duration{time.Nanosecond, 999 * time.Microsecond, 1500 * time.Microsecond} {
		if _, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}, Timeout: to}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("exec with timeout %s: %v, want invalid argument about the timeout", to, err)
		}
	}
	if st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}, Timeout: time.Millisecond * 5000}); err != nil || st.Code != 0 || st.TimedOut {
		t.Errorf("exec with a 5s timeout: %+v %v", st, err)
	}
	if _, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"true"}, Env: []string{big}}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("exec with a 1000 KiB env entry: %v, want invalid argument naming the limit", err)
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Env: []string{big}}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("create with a 1000 KiB env entry: %v, want invalid argument naming the limit", err)
	}
	many := make([]string, 20)
	for i := range many {
		many[i] = fmt.Sprintf("K%d=%s", i, strings.Repeat("y", 30<<10))
	}
	if _, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Env: many}); !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("create with 600 KiB of env: %v, want invalid argument naming the limit", err)
	}
	// Just under the limits, an exec runs.
	if st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo ${#K0}"}, Env: many[:8]}); err != nil || st.Code != 0 {
		t.Errorf("exec with 240 KiB of env: %+v %v, want it to run", st, err)
	}

	hc := rawClient(d)
	for _, body := range []string{
		`{"cmd": ["true"], "timeout_ms": 9300000000000}`,
		`{"cmd": ["true"], "timeout_ms": 9223372036854775807}`,
		`{"cmd": ["true"], "timeout_ms": -1}`,
	} {
		resp, err := hc.Post("http://clade/v1/sandboxes/"+sb.ID+"/exec", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "timeout_ms") {
			t.Errorf("exec %s: %d %s, want 400 about timeout_ms", body, resp.StatusCode, b)
		}
	}
}

// TestExecStreamIgnoresUnknownFrames: a frame type the daemon does not know,
// sent by the client mid-stream, is skipped, not taken as a reason to kill
// the command.
func TestExecStreamIgnoresUnknownFrames(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	sb := newSandbox(t, d.Client, sdk.CreateSandboxRequest{})
	conn, err := net.Dial("unix", d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body, _ := json.Marshal(api.ExecRequest{Cmd: []string{"sh", "-c", "read line; echo got $line"}, Stdin: true})
	req, _ := http.NewRequest("POST", "http://clade/v1/sandboxes/"+sb.ID+"/exec", bytes.NewReader(body))
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.UpgradeProtocol)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if v := resp.Header.Get(stream.VersionHeader); v != fmt.Sprint(stream.Version) {
		t.Errorf("%s: %q, want %d", stream.VersionHeader, v, stream.Version)
	}
	w := stream.NewWriter(conn, nil)
	for _, typ := range []stream.Type{0, 99, 200, 255} {
		if err := w.Write(typ, []byte("future")); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Write(stream.Stdin, []byte("hello\n"))
	_ = w.Write(stream.Stdin, nil)
	r := stream.NewReader(br)
	var out string
	for {
		f, err := r.Read()
		if err != nil {
			t.Fatalf("stream ended without an exit frame: %v (output %q)", err, out)
		}
		if f.Type == stream.Stdout {
			out += string(f.Payload)
		}
		if f.Type == stream.Exit {
			var st api.ExitStatus
			_ = json.Unmarshal(f.Payload, &st)
			if st.Code != 0 || out != "got hello\n" {
				t.Fatalf("exit %+v output %q; want the command to run to its end", st, out)
			}
			return
		}
	}
}

// TestExecLostReason: an exec whose sandbox is removed, or memory-killed,
// under it says so instead of "connection lost: EOF".
func TestExecLostReason(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client

	t.Run("removed", func(t *testing.T) {
		sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
		errc := make(chan error, 1)
		started := make(chan struct{})
		go func() {
			_, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo go; sleep 1000"},
				Stdout: &syncWriter{w: io.Discard, onWrite: func(string) { close(started) }}})
			errc <- err
		}()
		<-started
		if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err == nil || !strings.Contains(err.Error(), "removed") {
			t.Fatalf("exec in a sandbox removed under it: %v, want an error saying it was removed", err)
		}
	})

	t.Run("out of memory", func(t *testing.T) {
		sb := newSandbox(t, c, sdk.CreateSandboxRequest{MemoryMiB: 128})
		_, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c",
			"b = bytearray(600 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"}})
		if err == nil {
			t.Skip("the process, not the sandbox, was killed: nothing lost to report")
		}
		if !sdk.IsResourceExhausted(err) || !strings.Contains(err.Error(), "memory") {
			t.Fatalf("exec in a sandbox memory-killed under it: %v, want an error about memory", err)
		}
	})
}

// TestAgentAsInit: the agent is PID 1 and survives the signals init
// ignores; a frozen agent is reported as such.
func TestAgentAsInit(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	for _, sig := range []string{"TERM", "INT", "HUP", "USR1", "QUIT"} {
		r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "kill -" + sig + " 1; echo sent"}})
		if r.err != nil || r.stdout != "sent\n" {
			t.Fatalf("kill -%s 1: %+v", sig, r)
		}
		if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"echo", "alive"}}); r.err != nil || r.stdout != "alive\n" {
			t.Fatalf("after kill -%s 1 the sandbox answers %+v, want it alive", sig, r)
		}
	}
	// A child of the agent still gets the default action of TERM.
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "sleep 100 & kill -TERM $!; wait $!; echo $?"}}); r.stdout != "143\n" {
		t.Fatalf("a child killed with TERM: %+v, want status 143", r)
	}

	// kill -STOP 1 freezes the agent in gVisor (Linux would spare init).
	// The exec that sent it, and every later one, must say so quickly.
	for _, cmd := range []string{"sleep 0.2; kill -STOP 1; echo stopped", "true"} {
		ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
		t0 := time.Now()
		_, err := c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", cmd}})
		cancel()
		if err == nil {
			t.Skipf("%q: the agent still answers", cmd)
		}
		// Bounded: two missed pings of 8 s, apart by up to 5 s (a host too
		// loaded to schedule the agent is not taken for a frozen one).
		if !strings.Contains(err.Error(), "not responding") || time.Since(t0) > 60*time.Second {
			t.Fatalf("exec %q in a sandbox whose agent is stopped: %v after %s, want \"agent is not responding\" within 60s", cmd, err, time.Since(t0))
		}
		t.Logf("%q: frozen agent reported after %s: %v", cmd, time.Since(t0), err)
	}
}

// TestCopyEdgeCases: /proc files come out with their content; many small
// files into a small sandbox fail cleanly instead of killing it.
func TestCopyEdgeCases(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client

	t.Run("proc file", func(t *testing.T) {
		sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
		rc, err := c.CopyFrom(t.Context(), sb.ID, "/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		h, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Name != "status" || !strings.Contains(string(b), "Pid:") || int64(len(b)) != h.Size {
			t.Fatalf("copy of /proc/self/status: %q, %d bytes (header %d): want its content", h.Name, len(b), h.Size)
		}
	})

	t.Run("many files", func(t *testing.T) {
		// The smallest sandbox, so that the limit (4,096 files) comes fast.
		sb := newSandbox(t, c, sdk.CreateSandboxRequest{MemoryMiB: 64})
		pr := tarx.Stream(func(tw *tar.Writer) error {
			var err error
			for i := 0; i < 100000 && err == nil; i++ {
				err = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%d/f%d", i/1000, i), Mode: 0o644, Typeflag: tar.TypeReg})
			}
			return err
		})
		t0 := time.Now()
		err := c.CopyTo(t.Context(), sb.ID, "/tmp", pr)
		pr.Close()
		t.Logf("copy of 100,000 empty files: %v after %s", err, time.Since(t0))
		if err == nil {
			t.Fatal("100,000 files copied into a 64 MiB sandbox: want a resource-exhausted error")
		}
		if !sdk.IsResourceExhausted(err) || !strings.Contains(err.Error(), "memory") {
			t.Fatalf("copy of too many files: %v, want an error about the sandbox's memory", err)
		}
		if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"echo", "alive"}}); r.err != nil || r.stdout != "alive\n" {
			t.Fatalf("after the refused copy the sandbox answers %+v, want it alive", r)
		}
	})
}
