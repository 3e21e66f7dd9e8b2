package httpapi_test

import (
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/deadpeer"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// pausingWriter takes its first bytes, then holds the first write past
// after bytes for pause (a user's pager paused, a consumer busy), then
// takes the rest.
type pausingWriter struct {
	after, n int
	pause    time.Duration
	once     sync.Once
}

func (w *pausingWriter) Write(p []byte) (int, error) {
	if w.n >= w.after {
		w.once.Do(func() { time.Sleep(w.pause) })
	}
	w.n += len(p)
	return len(p), nil
}

// TestTCPExecReaderPauses: an exec over the TCP API whose client stops
// reading its output for longer than the dead-peer time (the daemon's
// send buffer full, the client's window closed, its kernel answering
// every probe) still gets all of it and its exit: a paused reader is not
// a dead peer. With TCP_USER_TIMEOUT on the daemon's listener, Linux cut
// the connection after 30 s of closed window.
func TestTCPExecReaderPauses(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	dir := testenv.TempDir(t)
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "secret-token")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := testenv.StartDaemon(t, "--listen", addr, "--token-file", tok)
	sb := newSandbox(t, d.Client, sdk.CreateSandboxRequest{})
	tc, err := sdk.New("http://"+addr, sdk.WithToken("secret-token"))
	if err != nil {
		t.Fatal(err)
	}
	const total = 64 << 20
	out := &pausingWriter{after: 1 << 20, pause: deadpeer.Default + 10*time.Second}
	st, err := tc.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"head", "-c", "67108864", "/dev/zero"}, Stdout: out})
	if err != nil || st.Code != 0 || out.n != total {
		t.Fatalf("exec whose reader paused %s: %+v %v, %d of %d bytes", out.pause, st, err, out.n, total)
	}
}
