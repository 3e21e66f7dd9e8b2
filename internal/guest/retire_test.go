package guest_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
)

// readLine starts `read x; echo "got $x"` on g, in flight until it is
// given a line.
func readLine(t *testing.T, g *guest.Conn) *guest.Process {
	t.Helper()
	p, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"/bin/sh", "-c", `read x; echo "got $x"`}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// finish gives p its line and checks that it ends well.
func finish(t *testing.T, p *guest.Process) {
	t.Helper()
	defer p.Close()
	outc := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(p.Stdout)
		outc <- string(b)
	}()
	_, werr := io.WriteString(p.Stdin, "hi\n")
	p.Stdin.Close()
	exit, err := p.Wait(t.Context())
	if out := <-outc; werr != nil || err != nil || exit.Code != 0 || out != "got hi\n" {
		t.Errorf("exec in flight: stdin %v, exit %+v %v, stdout %q; want exit 0, \"got hi\"", werr, exit, err, out)
	}
}

// TestRetire: a connection is retired (for a sleep of its sandbox) only
// while no call is open on it, unless forced; a retired one refuses every
// call before it starts with ErrRetired (Unavailable), lets the calls open
// run on, and serves again once unretired.
func TestRetire(t *testing.T) {
	g := agentConn(t)
	refused := func(what string) {
		t.Helper()
		_, err := g.Exec(t.Context(), guest.ExecRequest{Argv: []string{"true"}})
		if !guest.IsRetired(err) || !errdefs.IsUnavailable(err) {
			t.Errorf("%s: exec on a retired connection: %v, want ErrRetired (Unavailable)", what, err)
		}
		if _, err := g.Stat(t.Context(), "/"); !guest.IsRetired(err) {
			t.Errorf("%s: stat on a retired connection: %v, want ErrRetired", what, err)
		}
		if err := g.CopyIn(t.Context(), t.TempDir(), eofReader{t}); !guest.IsRetired(err) {
			t.Errorf("%s: upload on a retired connection: %v, want ErrRetired", what, err)
		}
	}

	p := readLine(t, g)
	if g.Retire(false) {
		t.Error("retired with an exec in flight")
	}
	finish(t, p)
	if !g.Retire(false) {
		t.Fatal("not retired with no call open")
	}
	refused("idle")
	g.Unretire()
	finish(t, readLine(t, g))

	p = readLine(t, g)
	if !g.Retire(true) {
		t.Fatal("a forced retire refused")
	}
	refused("forced")
	finish(t, p) // the call open runs on
	g.Unretire()
	finish(t, readLine(t, g))
}

// eofReader fails the test if a refused upload reads its archive.
type eofReader struct{ t *testing.T }

func (r eofReader) Read([]byte) (int, error) {
	r.t.Error("a refused upload read its archive")
	return 0, io.EOF
}

// TestRetireAndCloseEndWaits: calls waiting for an agent to connect are
// refused when the connection is retired (its agent does not come back
// before the sleep), and fail with the reason when it is closed, not when
// their context ends.
func TestRetireAndCloseEndWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	g := guest.NewConn()
	errc := make(chan error, 1)
	go func() {
		_, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}})
		errc <- err
	}()
	g.Retire(false)
	if err := <-errc; !guest.IsRetired(err) {
		t.Errorf("exec waiting for an agent, retired: %v, want ErrRetired", err)
	}

	g = guest.NewConn()
	go func() { errc <- g.Ready(ctx) }()
	reason := errdefs.New(errdefs.NotFound, "sandbox x was removed")
	g.Close(reason)
	if err := <-errc; !errors.Is(err, reason) {
		t.Errorf("waiting for an agent, closed: %v, want %v", err, reason)
	}
}
