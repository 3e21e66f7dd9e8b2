package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Everything that comes from inside a sandbox is hostile: these tests feed
// the host side of the protocol with a fake agent that lies. Whatever it
// sends, the host must close that one connection (or ignore the frame),
// never panic, and leak nothing.

// socketPair returns the two ends of a unix stream socket pair.
func socketPair(t testing.TB) (host, agent *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	host, agent = conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { host.Close(); agent.Close() })
	return host, agent
}

// noGrace makes calls on a lost connection fail at once.
func noGrace(t testing.TB) {
	old := lostGrace
	lostGrace = 0
	t.Cleanup(func() { lostGrace = old })
}

// fakeAgent is the agent's end of a connection, driven by a test.
type fakeAgent struct {
	t  testing.TB
	nc *net.UnixConn
	w  *wire.Conn
	r  *wire.Reader
}

func newFake(t testing.TB, nc *net.UnixConn) *fakeAgent {
	return &fakeAgent{t: t, nc: nc, w: wire.NewConn(nc), r: wire.NewReader(nc)}
}

func (a *fakeAgent) write(typ wire.Type, ch uint32, payload []byte) {
	a.t.Helper()
	if err := a.w.Write(typ, ch, payload); err != nil {
		a.t.Fatalf("fake agent: write %v: %v", typ, err)
	}
}

func (a *fakeAgent) writeJSON(typ wire.Type, ch uint32, v any) {
	a.t.Helper()
	b, _ := json.Marshal(v)
	a.write(typ, ch, b)
}

// read returns the next frame the host sent, within 10 s.
func (a *fakeAgent) read() (wire.Frame, error) {
	_ = a.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := a.r.Read()
	if err == nil {
		f.Payload = bytes.Clone(f.Payload)
	}
	return f, err
}

func (a *fakeAgent) expect(typ wire.Type) wire.Frame {
	a.t.Helper()
	f, err := a.read()
	if err != nil {
		a.t.Fatalf("fake agent: want a %v frame: %v", typ, err)
	}
	if f.Type != typ {
		a.t.Fatalf("fake agent: got a %v frame, want %v", f.Type, typ)
	}
	return f
}

// hello says hello with key (none: nil) and returns the key the host hands
// back, acknowledged, or nil if it handed none.
func (a *fakeAgent) hello(key []byte, features ...string) {
	a.t.Helper()
	if features == nil {
		features = []string{wire.FeatureAuth}
	}
	a.writeJSON(wire.Hello, 0, wire.HelloMsg{Version: wire.Version, PID: 1, Boot: 1, Features: features, Key: key})
}

// handshake says hello without a key, as a fresh agent, and takes the key.
func (a *fakeAgent) handshake() []byte {
	a.t.Helper()
	a.hello(nil)
	k := a.expect(wire.Key).Payload
	if len(k) != wire.KeySize {
		a.t.Fatalf("the host handed a key of %d bytes", len(k))
	}
	a.write(wire.Key, 0, nil)
	return k
}

// serveAsync serves nc on g; the channel yields Serve's result.
func serveAsync(g *Conn, nc net.Conn) <-chan error {
	done := make(chan error, 1)
	go func() { done <- g.Serve(nc) }()
	return done
}

// waitGoroutines fails t unless the goroutine count falls to base within
// 5 s: what a hostile peer made the host start must end with its
// connection.
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines left, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond) // polling a count, not ordering events
	}
}

func header(typ byte, ch uint32, n uint32) []byte {
	return []byte{typ, byte(ch >> 24), byte(ch >> 16), byte(ch >> 8), byte(ch), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}

func frame(typ wire.Type, ch uint32, payload string) []byte {
	return wire.AppendFrame(nil, typ, ch, []byte(payload))
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// hostileScripts are what a lying agent answers an Open on channel 1 with,
// as bytes. With closes, the host must drop the connection; without, it
// must ignore what it cannot use and end the exec with exit code 3.
var hostileScripts = []struct {
	name   string
	bytes  []byte
	closes bool
}{
	{"duplicate started", cat(frame(wire.Started, 1, `{"pid":5}`), frame(wire.Started, 1, `{"pid":5}`)), true},
	{"started that is not JSON", frame(wire.Started, 1, `{`), true},
	{"oversized length", header(byte(wire.Stdout), 1, wire.MaxPayload+1), true},
	{"length 4 GiB", header(byte(wire.Stdout), 1, 0xffffffff), true},
	{"unknown type", header(200, 1, 0), true},
	{"type zero", header(0, 1, 0), true},
	{"garbage", []byte("\xff\xfe\x00GET / HTTP/1.1\r\n\r\n"), true},
	{"hello mid-session", frame(wire.Hello, 0, `{"version":1}`), true},
	{"resize from the agent on channel 0", frame(wire.Resize, 0, ""), true},
	{"open from the agent", frame(wire.Open, 1, `{"op":"exec"}`), true},
	{"signal from the agent", frame(wire.Signal, 1, ""), true},
	{"malformed window", frame(wire.Window, 1, "abc"), true},
	{"exit that is not JSON", frame(wire.Exit, 1, "[]"), true},
	{"stdout past the window", cat(frame(wire.Started, 1, `{"pid":5}`),
		wire.AppendFrame(nil, wire.Stdout, 1, make([]byte, wire.MaxPayload)),
		wire.AppendFrame(nil, wire.Stdout, 1, make([]byte, 16))), true},
	{"truncated frame", header(byte(wire.Stdout), 1, 100)[:5], true},
	{"frames for unknown channels", cat(frame(wire.Started, 9999, `{"pid":1}`), frame(wire.Stdout, 9999, "x"),
		frame(wire.Exit, 9999, `{"code":1}`), frame(wire.Started, 0, `{`), frame(wire.Stdout, 0, "y"), frame(wire.Exit, 2, `{"code":1}`),
		frame(wire.Exit, 1, `{"code":3}`)), false},
	{"exit before started, then late frames", cat(frame(wire.Exit, 1, `{"code":3}`), frame(wire.Started, 1, `{"pid":5}`),
		frame(wire.Started, 1, `{"pid":5}`), frame(wire.Stdout, 1, "late"), frame(wire.Exit, 1, `{"code":9}`)), false},
	{"exit twice", cat(frame(wire.Started, 1, `{"pid":5}`), frame(wire.Exit, 1, `{"code":3}`), frame(wire.Exit, 1, `{"code":4}`)), false},
	{"pongs nobody asked for", cat(frame(wire.Pong, 0, "x"), frame(wire.Pong, 7, ""), frame(wire.Key, 0, "not asked"),
		frame(wire.Started, 1, `{"pid":-1}`), frame(wire.Exit, 1, `{"code":3}`)), false},
	{"quiesce unasked", frame(wire.Quiesce, 0, ""), true},
}

// TestHostileAgent answers an exec with each script: the daemon survives
// (a panic would end this test binary), the connection ends when it must
// and stays up when the frames can be ignored, and nothing leaks.
func TestHostileAgent(t *testing.T) {
	noGrace(t)
	for _, tc := range hostileScripts {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			g := NewConn()
			host, ag := socketPair(t)
			served := serveAsync(g, host)
			var serveErr error
			serveDone := false
			a := newFake(t, ag)
			a.handshake()
			type result struct {
				st  ExitStatus
				err error
			}
			res := make(chan result, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				p, err := g.Exec(ctx, ExecRequest{Argv: []string{"true"}})
				if err != nil {
					res <- result{err: err}
					return
				}
				st, err := p.Wait(ctx)
				res <- result{st, err}
			}()
			if f := a.expect(wire.Open); f.Channel != 1 {
				t.Fatalf("the first channel is %d, want 1", f.Channel)
			}
			if _, err := ag.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			if tc.closes {
				// A truncated frame only ends at EOF: the peer hangs up.
				if tc.name == "truncated frame" {
					_ = ag.CloseWrite()
				}
				select {
				case serveErr = <-served:
					serveDone = true
					if serveErr == nil {
						t.Fatal("Serve returned nil")
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the host kept a connection that broke the protocol")
				}
				if r := <-res; r.err == nil {
					t.Fatalf("the exec succeeded (%+v) on a connection that broke the protocol", r.st)
				}
			} else {
				r := <-res
				if r.err != nil || r.st.Code != 3 {
					t.Fatalf("exec = %+v, %v; want exit code 3", r.st, r.err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				pinged := make(chan error, 1)
				go func() { pinged <- g.Ping(ctx) }()
				a.write(wire.Pong, 0, a.expect(wire.Ping).Payload)
				err := <-pinged
				cancel()
				if err != nil {
					t.Fatalf("the connection did not survive frames it can ignore: %v", err)
				}
			}
			g.Close(nil)
			ag.Close()
			if !serveDone {
				<-served
			}
			waitGoroutines(t, base)
		})
	}
}

// FuzzAgentFrames feeds what an agent answers an exec's Open with: any
// bytes. The host must end the exec and the connection without a panic.
func FuzzAgentFrames(f *testing.F) {
	for _, tc := range hostileScripts {
		f.Add(tc.bytes)
	}
	f.Add(frame(wire.Started, 1, `{"pid":5}`))
	f.Add(cat(frame(wire.Started, 1, `{"pid":5}`), frame(wire.Stdout, 1, "out"), frame(wire.Stderr, 1, "err"),
		frame(wire.Stdout, 1, ""), frame(wire.Window, 1, "\x04\x00\x00\x10\x00"), frame(wire.Exit, 1, `{"code":0,"info":"e30="}`)))
	noGrace(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		g := NewConn()
		host, ag := socketPair(t)
		served := serveAsync(g, host)
		a := newFake(t, ag)
		a.handshake()
		execd := make(chan struct{})
		go func() {
			defer close(execd)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := g.Exec(ctx, ExecRequest{Argv: []string{"true"}, Stdin: true})
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, p.Stdout) }()
			_, _ = p.Wait(ctx)
		}()
		a.expect(wire.Open)
		// Drain what the host writes (acks, pings) so it never blocks.
		go func() { _, _ = io.Copy(io.Discard, ag) }()
		_, _ = ag.Write(data)
		_ = ag.CloseWrite()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after the agent hung up")
		}
		g.Close(nil)
		<-execd
	})
}

// agentFake serves a fake agent's connection after its handshake: pongs,
// an exit of code 0 for every Open, acks of keys. It returns the keys the
// host handed it on this connection.
func (a *fakeAgent) serveStd() <-chan [][]byte {
	keys := make(chan [][]byte, 1)
	go func() {
		var got [][]byte
		defer func() { keys <- got }()
		for {
			f, err := a.r.Read()
			if err != nil {
				return
			}
			var werr error
			switch f.Type {
			case wire.Ping:
				werr = a.w.Write(wire.Pong, 0, bytes.Clone(f.Payload))
			case wire.Open:
				werr = a.w.Write(wire.Exit, f.Channel, []byte(`{"code":0}`))
			case wire.Key:
				got = append(got, bytes.Clone(f.Payload))
				werr = a.w.Write(wire.Key, 0, nil)
			}
			if werr != nil {
				return
			}
		}
	}()
	return keys
}

func ping(t *testing.T, g *Conn) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return g.Ping(ctx)
}

func execTrue(t *testing.T, g *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	p, err := g.Exec(ctx, ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("exec: %+v, %v", st, err)
	}
}

// TestImpostorRefused: a process in the sandbox other than the agent
// dials the agent's socket. Whatever hello it tries, it is refused, and
// the real agent's connection keeps serving.
func TestImpostorRefused(t *testing.T) {
	noGrace(t)
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	host, ag := socketPair(t)
	serveAsync(g, host)
	real := newFake(t, ag)
	key := real.handshake()
	realDone := real.serveStd()
	execTrue(t, g) // processes other than the agent may run from now on

	wrong := bytes.Repeat([]byte{1}, wire.KeySize)
	for _, tc := range []struct {
		name  string
		hello func(a *fakeAgent)
	}{
		{"no key", func(a *fakeAgent) { a.hello(nil) }},
		{"wrong key", func(a *fakeAgent) { a.hello(wrong) }},
		{"short key", func(a *fakeAgent) { a.hello(key[:8]) }},
		{"right key, no auth feature", func(a *fakeAgent) { a.hello(key, wire.FeaturePTY) }},
		{"no hello", func(a *fakeAgent) { a.writeJSON(wire.Started, 1, wire.StartedMsg{PID: 1}) }},
		{"garbage", func(a *fakeAgent) { _, _ = a.nc.Write([]byte("\x01\x00\x00\x00\x00\x00\x00\x00\x02{x")) }},
		{"an old agent", func(a *fakeAgent) { a.writeJSON(wire.Hello, 0, wire.HelloMsg{Version: wire.Version, PID: 1, Boot: 2}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, ag := socketPair(t)
			served := serveAsync(g, host)
			tc.hello(newFake(t, ag))
			select {
			case err := <-served:
				if !IsRejected(err) {
					t.Fatalf("Serve = %v, want a rejection", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("an impostor's connection was not refused")
			}
			if err := ping(t, g); err != nil {
				t.Fatalf("the real agent's connection is gone: %v", err)
			}
			execTrue(t, g)
		})
	}

	t.Run("real agent reconnects", func(t *testing.T) {
		host, ag := socketPair(t)
		serveAsync(g, host)
		a := newFake(t, ag)
		a.hello(key)
		keys := a.serveStd()
		<-realDone // the host dropped the old connection for the new one
		execTrue(t, g)
		ag.Close()
		if got := <-keys; len(got) != 0 {
			t.Fatalf("a reconnect with the current key was handed %d new keys", len(got))
		}
	})
}

// TestRestoredKeys: copies restored from one snapshot present its key;
// each is handed a key of its own, after which the snapshot's key no
// longer speaks for any of them.
func TestRestoredKeys(t *testing.T) {
	noGrace(t)
	snap := bytes.Repeat([]byte{7}, wire.KeySize)
	var handed [][]byte
	var conns []*Conn
	for i := range 2 {
		g := NewConn()
		t.Cleanup(func() { g.Close(nil) })
		var saved [][][]byte
		g.Authenticate(Auth{Keys: [][]byte{snap}, Restored: true, Save: func(k [][]byte) error { saved = append(saved, k); return nil }})
		host, ag := socketPair(t)
		serveAsync(g, host)
		a := newFake(t, ag)
		a.hello(snap)
		k := a.expect(wire.Key).Payload
		a.write(wire.Key, 0, nil)
		a.serveStd()
		execTrue(t, g) // the ack was read before the exec's exit
		if bytes.Equal(k, snap) || (i > 0 && bytes.Equal(k, handed[0])) {
			t.Fatalf("copy %d was handed a key that is not its own", i)
		}
		if len(saved) != 2 || !bytes.Equal(saved[0][0], k) || len(saved[1]) != 1 || !bytes.Equal(saved[1][0], k) {
			t.Fatalf("saved %x; want the new key (with the old) before it was handed, then it alone", saved)
		}
		if got := g.Keys(); len(got) != 1 || !bytes.Equal(got[0], k) {
			t.Fatalf("Keys = %x, want only the copy's own", got)
		}
		handed = append(handed, k)
		conns = append(conns, g)
	}
	for i, g := range conns {
		for _, k := range [][]byte{snap, handed[1-i]} {
			host, ag := socketPair(t)
			served := serveAsync(g, host)
			newFake(t, ag).hello(k)
			if err := <-served; !IsRejected(err) {
				t.Fatalf("copy %d took a key not its own: %v", i, err)
			}
		}
	}
}

// TestKeyBeforeAck: a connection lost before the agent acknowledged its
// new key leaves the key it presented valid, so the agent is not locked
// out; a fresh sandbox's trust in a hello without a key ends with its
// first channel.
func TestKeyBeforeAck(t *testing.T) {
	noGrace(t)
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	host, ag := socketPair(t)
	served := serveAsync(g, host)
	a := newFake(t, ag)
	a.hello(nil)
	k1 := a.expect(wire.Key).Payload
	ag.Close() // before the ack
	if err := <-served; err == nil || IsRejected(err) {
		t.Fatalf("first connection: %v", err)
	}
	// It never got k1: it says hello without a key again (no channel was
	// opened, so nothing else can run yet).
	host, ag = socketPair(t)
	served = serveAsync(g, host)
	a = newFake(t, ag)
	a.hello(nil)
	k2 := a.expect(wire.Key).Payload
	ag.Close()
	<-served
	// It got k2 but the ack was lost: it presents k2, which is
	// accepted as it stands.
	host, ag = socketPair(t)
	serveAsync(g, host)
	a = newFake(t, ag)
	a.hello(k2)
	keys := a.serveStd()
	execTrue(t, g)
	ag.Close()
	if got := <-keys; len(got) != 0 {
		t.Fatalf("the agent presenting its key was handed %d more", len(got))
	}
	if got := g.Keys(); len(got) != 1 || !bytes.Equal(got[0], k2) {
		t.Fatalf("Keys = %x, want only %x", got, k2)
	}
	for _, k := range [][]byte{nil, k1} {
		host, ag := socketPair(t)
		served := serveAsync(g, host)
		newFake(t, ag).hello(k)
		if err := <-served; !IsRejected(err) {
			t.Fatalf("a hello with key %x after the ack: %v, want a rejection", k, err)
		}
	}
}

// TestSilentConnectionsDoNotBlockTheAgent: connections that dial and say
// nothing (an impostor holding them open) are dropped oldest first, and
// the agent still gets in.
func TestSilentConnectionsDoNotBlockTheAgent(t *testing.T) {
	noGrace(t)
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	dropped := make(chan error, maxPending+2)
	for range maxPending + 2 {
		host, _ := socketPair(t)
		go func() { dropped <- g.Serve(host) }()
	}
	for i := range 2 {
		select {
		case <-dropped:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d silent connections dropped, want 2", i)
		}
	}
	host, ag := socketPair(t)
	serveAsync(g, host)
	a := newFake(t, ag)
	a.handshake()
	a.serveStd()
	if err := ping(t, g); err != nil {
		t.Fatalf("the agent did not get in past silent connections: %v", err)
	}
}

// TestLegacyAgentAccepted: the agent of a sandbox or snapshot made before
// agent keys says hello without the auth feature; with Auth.Legacy (its
// key file is missing) it is served rather than refused (refusing it
// would lose the sandbox), and the host hands it no key it cannot use.
func TestLegacyAgentAccepted(t *testing.T) {
	noGrace(t)
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	g.Authenticate(Auth{Restored: true, Legacy: true})
	host, ag := socketPair(t)
	served := serveAsync(g, host)
	old := newFake(t, ag)
	old.writeJSON(wire.Hello, 0, wire.HelloMsg{Version: wire.Version, PID: 1, Boot: 2})
	done := old.serveStd()
	execTrue(t, g)
	select {
	case err := <-served:
		t.Fatalf("the legacy agent's connection ended: %v", err)
	default:
	}
	g.Close(nil)
	if keys := <-done; len(keys) != 0 {
		t.Fatalf("the host handed a legacy agent keys: %d", len(keys))
	}
}

// TestOldAgentRefusesUser: an agent whose hello lacks FeatureUser would
// ignore a request's user and run it as root: the host refuses to send
// it one, with an error that says why, and sends nothing to the agent.
func TestOldAgentRefusesUser(t *testing.T) {
	g := NewConn()
	t.Cleanup(func() { g.Close(nil) })
	host, ag := socketPair(t)
	serveAsync(g, host)
	old := newFake(t, ag)
	old.handshake()
	opens := make(chan struct{}, 4)
	go func() {
		for {
			f, err := old.r.Read()
			if err != nil {
				return
			}
			switch f.Type {
			case wire.Ping:
				_ = old.w.Write(wire.Pong, 0, bytes.Clone(f.Payload))
			case wire.Open:
				opens <- struct{}{}
				_ = old.w.Write(wire.Exit, f.Channel, []byte(`{"code":0}`))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := g.Exec(ctx, ExecRequest{Argv: []string{"whoami"}, User: "user"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "predates running as another user") {
		t.Fatalf("exec as a user on an old agent: %v", err)
	}
	if err := g.CopyInAs(ctx, "/tmp", "user", bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("upload as a user on an old agent: %v", err)
	}
	select {
	case <-opens:
		t.Fatal("a request with a user reached an agent that would ignore it")
	default:
	}
	execTrue(t, g) // without a user it is served
}
