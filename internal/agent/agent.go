// Package agent is clade's in-sandbox agent (the host side of its protocol
// is package guest). The agent runs as PID 1 of every sandbox: it reaps zombies, owns
// every process it starts, and serves exec and file transfer to the host over
// one long-lived multiplexed connection (see package wire). The agent dials
// out to a host socket rather than listening, because a socket bound inside
// the sandbox onto a host path blocks checkpoint, while a dialled-out one
// survives it: after a restore the agent sees the connection fail and dials
// again.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/agent/wire"
)

// Config is the agent's configuration.
type Config struct {
	// Socket is the host socket to dial, as seen inside the sandbox.
	Socket string
	// BaseEnv is the environment every exec starts from.
	BaseEnv []string
	// Workdir and User are every exec's defaults (the image's WorkingDir
	// and User); empty means / and root.
	Workdir string
	User    string
	// Etc is the directory whose hostname and hosts files the agent keeps
	// naming the sandbox (see hostfiles.go); empty leaves them alone (the
	// agent's tests run on the host).
	Etc string
	// Accounts is the directory whose passwd and group files name the
	// users an exec may run as; empty means /etc (tests point it
	// elsewhere).
	Accounts string
	Log      *slog.Logger
}

// accounts is the directory of the sandbox's passwd and group files.
func (a *Agent) accounts() string {
	if a.cfg.Accounts == "" {
		return "/etc"
	}
	return a.cfg.Accounts
}

// Agent serves the host.
type Agent struct {
	cfg    Config
	reaper *reaper
	boot   int
	// fastUntil makes the agent redial every millisecond until then: set
	// by a quiesce, so reconnecting after a snapshot or restore is quick.
	fastUntil time.Time

	// hostFiles is held while /etc/hostname and /etc/hosts are rewritten
	// after a rename (renameHostFiles).
	hostFiles sync.Mutex

	// key is what the agent presents in its hello (wire.HelloMsg.Key):
	// the last one the host handed it, in memory only. Only the serving
	// goroutine touches it.
	key []byte

	// kept is the commands that outlive their channels (kept.go).
	kept keptTable

	mu sync.Mutex
	// secretEnv is merged into every exec's environment (wire.Request's
	// SecretEnv). Memory only: it lives on in a checkpoint of the sandbox,
	// never in a file. Guarded by mu.
	secretEnv []string
	// hostEnv is HOSTNAME once the host gave the sandbox a hostname (a
	// claimed hot sandbox, a prepared one, a fork child): BaseEnv holds
	// the one the agent started with (or the parent's, in a restored
	// copy). Guarded by mu.
	hostEnv []string
}

// execEnv is the environment of an exec that asks for env.
func (a *Agent) execEnv(env []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return wire.MergeEnv(a.cfg.BaseEnv, a.hostEnv, a.secretEnv, env)
}

// New returns an agent. Call Run to serve.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Agent{cfg: cfg, reaper: newReaper()}
}

// Run reaps children and keeps a connection to the host until ctx ends,
// reconnecting whenever it breaks (daemon restart, sandbox restore).
func (a *Agent) Run(ctx context.Context) error {
	go a.reaper.run(ctx)
	ignoreInitSignals(ctx)
	if name, err := os.Hostname(); err == nil {
		a.writeHostFiles(name)
	}
	backoff := time.Millisecond
	var failingSince time.Time // zero while connected
	port := isCharDevice(a.cfg.Socket)
	var quiesced bool
	for ctx.Err() == nil {
		var nc net.Conn
		var err error
		if port {
			nc, err = dialPort(ctx, a.cfg.Socket, quiesced)
		} else {
			nc, err = (&net.Dialer{}).DialContext(ctx, "unix", a.cfg.Socket)
		}
		if err != nil {
			now := time.Now()
			if failingSince.IsZero() {
				failingSince = now
			}
			if now.Before(a.fastUntil) {
				backoff = time.Millisecond
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, redialCap(now.Sub(failingSince)))
			continue
		}
		failingSince = time.Time{}
		backoff = time.Millisecond
		a.boot++
		err = a.serve(ctx, nc)
		quiesced = errors.Is(err, errQuiesce)
		a.cfg.Log.Info("host connection ended", "err", err)
	}
	return ctx.Err()
}

// redialCap bounds the wait between dials once they have failed for
// failing. For a second it is 10 ms: a connection lost without a quiesce
// (a restore that caught a half-made connection, a daemon restarting) is
// back at once. After that the host is down for longer (a daemon stopped
// or restarting), and a failed dial is not free under gVisor (a trap, the
// sentry's socket lookup, a timer): 200 sandboxes redialling every 10 ms
// kept both cores of a host busy (~380% CPU, load 700) while the daemon
// was down, and its restart took minutes to reattach them. 250 ms costs
// them ~0.15 cores, and a restarted daemon waits at most that for each.
func redialCap(failing time.Duration) time.Duration {
	if failing < time.Second {
		return 10 * time.Millisecond
	}
	return 250 * time.Millisecond
}

// initIgnored are the signals the agent, as init, must survive when a
// process in the sandbox sends them (`kill -TERM 1`). Linux spares a
// namespace's init the signals it has no handler for, but the Go runtime
// handles these and exits on them. They are caught and dropped rather than
// set to SIG_IGN, which every process the agent starts would inherit.
var initIgnored = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGVTALRM,
	syscall.SIGPROF, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGTSTP, syscall.SIGTTIN,
	syscall.SIGTTOU, syscall.SIGPWR, syscall.SIGIO, syscall.SIGWINCH}

func ignoreInitSignals(ctx context.Context) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, initIgnored...)
	go func() {
		defer signal.Stop(sigs)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			}
		}
	}()
}

// session is one connection to the host and the channels open on it.
type session struct {
	a    *Agent
	conn *wire.Conn

	mu    sync.Mutex
	chans map[uint32]*channel
}

func (a *Agent) serve(ctx context.Context, nc net.Conn) error {
	s := &session{a: a, conn: wire.NewConn(nc), chans: map[uint32]*channel{}}
	defer s.closeAll()
	defer nc.Close()
	hello, _ := json.Marshal(wire.HelloMsg{Version: wire.Version, PID: os.Getpid(), Boot: a.boot,
		Features: []string{wire.FeaturePTY, wire.FeatureSecretEnv, wire.FeatureAuth, wire.FeatureUser, wire.FeatureWatch, wire.FeatureXattr, wire.FeatureKeep, wire.FeatureKillAll, wire.FeatureWriteThrough}, Key: a.key})
	if err := s.conn.Write(wire.Hello, 0, hello); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	r := wire.NewReader(nc)
	for {
		f, err := r.Read()
		if err != nil {
			return err
		}
		if err := s.handle(ctx, f); err != nil {
			return err
		}
	}
}

// errQuiesce ends a session on the host's request.
var errQuiesce = errors.New("quiesced for a snapshot")

func (s *session) handle(ctx context.Context, f wire.Frame) error {
	switch f.Type {
	case wire.Quiesce:
		s.a.fastUntil = time.Now().Add(time.Minute)
		s.detachAll()
		// Say so before hanging up: over a virtio port (a VM) the host
		// does not see the hang-up itself.
		_ = s.conn.Write(wire.Quiesce, 0, nil)
		return errQuiesce
	case wire.Ping:
		return s.conn.Write(wire.Pong, f.Channel, f.Payload)
	case wire.Key:
		if len(f.Payload) != wire.KeySize {
			return fmt.Errorf("key: %d bytes, want %d", len(f.Payload), wire.KeySize)
		}
		// In place: the key before it is gone from the agent's memory (a
		// fork child's was its siblings' too).
		if len(s.a.key) != wire.KeySize {
			s.a.key = make([]byte, wire.KeySize)
		}
		copy(s.a.key, f.Payload)
		return s.conn.Write(wire.Key, 0, nil)
	case wire.Open:
		var req wire.Request
		if err := json.Unmarshal(f.Payload, &req); err != nil {
			return fmt.Errorf("open: %w", err)
		}
		s.mu.Lock()
		if _, dup := s.chans[f.Channel]; dup || f.Channel == 0 {
			s.mu.Unlock()
			return fmt.Errorf("open: channel %d in use", f.Channel)
		}
		ch := newChannel(s, f.Channel, req)
		s.chans[f.Channel] = ch
		s.mu.Unlock()
		if req.Op == wire.OpTarPut && ch.stdin != nil {
			// A push gets the bulk window: the host takes the extra
			// credit whatever its version.
			if err := ch.stdin.Widen(wire.BulkWindow); err != nil {
				return err
			}
		}
		if req.Op == wire.OpIdentity {
			// Applied in order, before any later frame is read: a
			// channel the host opens after it sees the new identity
			// (a claimed hot sandbox's hostname), and it costs no
			// goroutine. It never blocks on the host.
			ch.run(ctx)
			return nil
		}
		go ch.run(ctx)
		return nil
	}
	s.mu.Lock()
	ch := s.chans[f.Channel]
	s.mu.Unlock()
	if ch == nil {
		return nil // a channel that already finished; late frames are harmless
	}
	switch f.Type {
	case wire.Stdin:
		if ch.stdin == nil {
			return errors.New("stdin frame on a channel opened without stdin")
		}
		return ch.stdin.Push(f.Payload)
	case wire.Window:
		st, n, err := wire.ParseWindow(f.Payload)
		if err != nil {
			return err
		}
		switch st {
		case wire.Stdout:
			ch.stdout.Grant(n)
		case wire.Stderr:
			ch.stderr.Grant(n)
		}
	case wire.Signal:
		if sig, ok := stream.ParseSignal(f.Payload); ok {
			ch.signal(sig)
		}
	case wire.Close:
		ch.abort()
	case wire.Resize:
		if rows, cols, ok := stream.ParseResize(f.Payload); ok {
			ch.resize(rows, cols)
		}
	}
	return nil
}

func (s *session) remove(id uint32) {
	s.mu.Lock()
	delete(s.chans, id)
	s.mu.Unlock()
}

// detachAll lets the session's channels run on without the host.
func (s *session) detachAll() {
	s.mu.Lock()
	chans := s.chans
	s.chans = map[uint32]*channel{}
	s.mu.Unlock()
	for _, ch := range chans {
		ch.detach()
	}
}

// closeAll kills whatever runs on the session's channels: the host that asked
// for them is gone, and nobody could read their output.
func (s *session) closeAll() {
	s.mu.Lock()
	chans := s.chans
	s.chans = map[uint32]*channel{}
	s.mu.Unlock()
	for _, ch := range chans {
		ch.abort()
	}
}
