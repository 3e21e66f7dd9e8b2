package codeint_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/sdk"
)

// TestInterpreterWedgedServer: a server that takes requests and never
// answers (wedged, or the sandbox's user's) holds no API request past its
// bound: a run past its timeout and the daemon's answer wait, another
// request past the answer wait. The daemon's wait is its
// --code-answer-timeout, 20 s here: with the default (150 s) the test held
// a parallel slot for two and a half minutes, waiting.
func TestInterpreterWedgedServer(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	const wait = 20 * time.Second
	d, id := start(t, "--code-answer-timeout", wait.String())
	c := d.Client
	run(t, c, id, sdk.RunCodeRequest{Code: "1"})
	out, code := execOut(t, c, id, `kill -9 $(cat /run/clade-codeint/server.pid); setsid nohup python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 49999)); s.listen(50)
held = []
while True: held.append(s.accept()[0])
' >/dev/null 2>&1 </dev/null & echo $! >/run/clade-codeint/server.pid
while ! awk '$2 ~ /:C34F$/ && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6; do sleep 0.05; done`)
	if code != 0 {
		t.Fatalf("%q %d", out, code)
	}
	var wg sync.WaitGroup
	try := func(name string, f func(ctx context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The caller waits well past the bound.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			t0 := time.Now()
			err := f(ctx)
			took := time.Since(t0)
			if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "did not answer") && !strings.Contains(err.Error(), "not answering") {
				t.Errorf("%s on a wedged server: %v after %s", name, err, took)
				return
			}
			// The daemon's wait, not the default one: none ends before
			// it, and each well before the default's 150 s.
			if took < wait || took >= codeint.DefaultAnswerWait {
				t.Errorf("%s on a wedged server: %v after %s, not within [%s, %s)", name, err, took, wait, codeint.DefaultAnswerWait)
				return
			}
			t.Logf("%s on a wedged server: %v after %s", name, err, took)
		}()
	}
	try("a run with a 1 s timeout", func(ctx context.Context) error {
		ex, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "1", TimeoutMS: 1000}, nil)
		if err == nil && ex.Error != nil {
			return errors.New(ex.Error.Value)
		}
		return err
	})
	try("a run with no timeout", func(ctx context.Context) error {
		_, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "1"}, nil)
		return err
	})
	try("listing contexts", func(ctx context.Context) error {
		_, err := c.CodeContexts(ctx, id)
		return err
	})
	wg.Wait()
}

// TestInterpreterFloodingServer: a server (not clade's) that answers a
// run with far more output than clade's server ever sends does not fill
// sdk.RunCode's caller's memory: past its bounds it keeps nothing more and
// says so.
func TestInterpreterFloodingServer(t *testing.T) {
	t.Parallel() // beside another test of start(t): see there
	d, id := start(t)
	c := d.Client
	run(t, c, id, sdk.RunCodeRequest{Code: "1"})
	// Environment names a shell refuses, values no environment holds.
	for _, env := range []map[string]string{{"é": "1"}, {"A-B": "1"}, {"A": "a\x00b"}} {
		_, err := c.RunCode(context.Background(), id, sdk.RunCodeRequest{Code: "1", Language: "bash", Env: env}, nil)
		if err == nil || !strings.Contains(err.Error(), "env_vars") {
			t.Fatalf("env %q: %v", env, err)
		}
	}

	out, code := execOut(t, c, id, `kill -9 $(cat /run/clade-codeint/server.pid); setsid nohup python3 -c '
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        line = (json.dumps({"type": "stdout", "text": "x" * 65536}) + "\n").encode()
        for _ in range(640):
            self.wfile.write(line)
        self.wfile.write(b"{\"type\": \"end_of_execution\"}\n")
        self.close_connection = True
ThreadingHTTPServer(("0.0.0.0", 49999), H).serve_forever()
' >/dev/null 2>&1 </dev/null & echo $! >/run/clade-codeint/server.pid
while ! awk '$2 ~ /:C34F$/ && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6; do sleep 0.05; done`)
	if code != 0 {
		t.Fatalf("%q %d", out, code)
	}
	seen := 0
	ex, err := c.RunCode(context.Background(), id, sdk.RunCodeRequest{Code: "1", TimeoutMS: 60_000}, func(ev sdk.CodeEvent) { seen += len(ev.Text) })
	if err != nil {
		t.Fatal(err)
	}
	kept := len(strings.Join(ex.Stdout, ""))
	if seen != 640*65536 || kept > sdk.MaxKeptOutput || !ex.Truncated {
		t.Fatalf("40 MiB of stdout: onEvent saw %d bytes, RunCode kept %d (truncated %v)", seen, kept, ex.Truncated)
	}
}
