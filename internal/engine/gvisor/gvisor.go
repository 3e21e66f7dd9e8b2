// Package gvisor is the clade engine that runs sandboxes under gVisor's runsc.
//
// Every runsc call gets stdio on files, never pipes: `runsc run --detach`
// hands its stdio to the sandbox, so reading a pipe to EOF would hang until
// the sandbox dies. Every call for one id uses the same global flags, and ids
// have a fixed length because runsc matches container ids by prefix.
package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

var (
	_ engine.Engine      = (*Engine)(nil)
	_ engine.Snapshotter = (*Engine)(nil)
)

// Paths inside every sandbox.
const (
	guestBinDir  = "/.clade/bin"
	guestRunDir  = "/.clade/run"
	guestAgent   = guestBinDir + "/clade-agent"
	guestSocket  = guestRunDir + "/agent.sock"
	agentSockEnv = "CLADE_AGENT_SOCKET"
)

// Config configures the engine.
type Config struct {
	// StateDir holds runsc's state, bundles and per-sandbox files.
	StateDir string
	// Runsc is the runsc binary.
	Runsc string
	// AgentPath is the clade-agent binary on the host (static).
	AgentPath string
	// Platform is runsc's --platform; systrap when empty (kvm hangs on
	// nested hosts like ours).
	Platform string
	// ReadyTimeout bounds how long Create waits for the agent; 30s if zero.
	ReadyTimeout time.Duration
	Log          *slog.Logger
}

// Engine drives runsc.
type Engine struct {
	cfg     Config
	runRoot string
	sbRoot  string
	binDir  string

	mu   sync.Mutex
	live map[string]*sandbox
	// prepared maps ids of created-not-started containers to the hostname
	// they were created with.
	prepared map[string]string
	// preparedNS holds the network namespace a prepared container was
	// created in: runsc takes the network when it creates the sandbox.
	preparedNS map[string]string
}

// New checks the configuration and prepares the state directory.
func New(cfg Config) (*Engine, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	runsc, err := findRunsc(cfg.Runsc)
	if err != nil {
		return nil, err
	}
	cfg.Runsc = runsc
	e := &Engine{cfg: cfg, runRoot: filepath.Join(cfg.StateDir, "runsc"), sbRoot: filepath.Join(cfg.StateDir, "sandboxes"),
		binDir: filepath.Join(cfg.StateDir, "bin"), live: map[string]*sandbox{}, prepared: map[string]string{}, preparedNS: map[string]string{}}
	for _, d := range []string{e.runRoot, e.sbRoot, e.binDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := e.installAgent(); err != nil {
		return nil, err
	}
	return e, nil
}

func findRunsc(p string) (string, error) {
	if p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("runsc not found at %s: run `make deps` or set --runsc", p)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		if c := filepath.Join(filepath.Dir(exe), "runsc"); fileExists(c) {
			return c, nil
		}
	}
	if c, err := exec.LookPath("runsc"); err == nil {
		return c, nil
	}
	return "", errors.New("runsc not found: run `make deps` or set --runsc")
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// installAgent copies the agent into the state dir, which is bind-mounted
// read-only into every sandbox: the host's bin directory also holds runsc and
// clade, which sandboxes have no business seeing.
func (e *Engine) installAgent() error {
	if e.cfg.AgentPath == "" {
		return errors.New("no agent binary configured: build clade-agent (make build) or set --agent")
	}
	src, err := os.ReadFile(e.cfg.AgentPath)
	if err != nil {
		return fmt.Errorf("agent binary: %w: run `make build` or set --agent", err)
	}
	dst := filepath.Join(e.binDir, "clade-agent")
	if cur, err := os.ReadFile(dst); err == nil && sha256.Sum256(cur) == sha256.Sum256(src) {
		return nil
	}
	// Write aside and rename: running sandboxes keep the old inode.
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, src, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// Name implements engine.Engine.
func (e *Engine) Name() string { return "gvisor" }

// RunscVersion returns `runsc --version`'s first line.
func (e *Engine) RunscVersion(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, e.cfg.Runsc, "--version").Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}

type sandbox struct {
	id     string
	dir    string
	pid    int
	client *agent.Client
	mu     sync.Mutex
	ln     net.Listener
	// expectExit marks an exit we caused (a checkpoint that stops it).
	expectExit atomic.Bool
	exited     chan struct{}
	reason     string

	stopOnce sync.Once
	stopped  chan struct{}
}

func (s *sandbox) Exited() <-chan struct{} { return s.exited }
func (s *sandbox) ExitReason() string      { return s.reason }

// watch closes s.exited when the sandbox process ends without Destroy.
// A pidfd tells us without polling; the process is not our child.
func (e *Engine) watch(s *sandbox) {
	fd, err := unix.PidfdOpen(s.pid, 0)
	if err != nil {
		go func() { <-s.stopped; close(s.exited) }()
		return
	}
	go func() {
		defer unix.Close(fd)
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 500)
			select {
			case <-s.stopped:
				close(s.exited) // destroyed or let go: not an exit by itself
				return
			default:
			}
			if err == unix.EINTR || n == 0 {
				continue
			}
			break
		}
		if s.expectExit.Load() {
			close(s.exited)
			return
		}
		s.reason = "the sandbox stopped unexpectedly"
		if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/clade", s.id, "memory.failcnt")); err == nil && strings.TrimSpace(string(b)) != "0" {
			s.reason = "the sandbox exceeded its memory limit and was killed"
		}
		close(s.exited)
	}()
}

func (s *sandbox) ID() string            { return s.id }
func (s *sandbox) Agent() *agent.Client  { return s.client }
func (s *sandbox) PID() int              { return s.pid }
func (e *Engine) dir(id string) string   { return filepath.Join(e.sbRoot, id) }
func (e *Engine) upper(id string) string { return filepath.Join(e.dir(id), "upper") }

// globalFlags are the same for every call about one id.
func (e *Engine) globalFlags(id string) []string {
	// A sandbox with a namespace of its own runs gVisor's network stack
	// over the veth it finds there; without, a loopback-only stack.
	network := "none"
	if fileExists(filepath.Join(e.dir(id), netnsFile)) {
		network = "sandbox"
	}
	return []string{
		"--root", e.runRoot,
		"--platform", e.cfg.Platform,
		"--network", network,
		"--host-uds", "open",
		"--overlay2", "root:dir=" + e.upper(id),
		"--log-format", "text",
	}
}

// runsc runs one runsc command for id with stdio on a log file.
func (e *Engine) runsc(ctx context.Context, id string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(e.dir(id), "runsc.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(id), args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, tail(logf.Name(), start))
	}
	return nil
}

// tail returns what a log gained after offset, shortened to its last lines.
func tail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	s := strings.TrimSpace(string(b[offset:]))
	if len(s) > 600 {
		s = "..." + s[len(s)-600:]
	}
	return s
}

// Create implements engine.Engine.
func (e *Engine) Create(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	return e.start(ctx, spec, false, func(dir string, prepared bool) error {
		if prepared {
			return e.runsc(ctx, spec.ID, "start", spec.ID)
		}
		return e.runsc(ctx, spec.ID, "run", "--bundle", dir, "--pid-file", filepath.Join(dir, "pid"), "--detach", spec.ID)
	})
}

// Restore implements engine.Snapshotter.
func (e *Engine) Restore(ctx context.Context, spec engine.Spec, image string) (engine.Sandbox, error) {
	return e.start(ctx, spec, true, func(dir string, _ bool) error {
		// Into the prepared (created, not started) container if there is
		// one: that halves the restore.
		return e.runsc(ctx, spec.ID, "restore", "--image-path", image, "--bundle", dir, "--pid-file", filepath.Join(dir, "pid"), "--detach", spec.ID)
	})
}

// Prepare implements engine.Preparer: it lays out the sandbox and creates
// its runsc container without starting it, so that a Create or Restore with
// the same spec later only starts or restores into it.
func (e *Engine) Prepare(ctx context.Context, spec engine.Spec) (err error) {
	sb, err := e.layout(ctx, spec)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
		}
	}()
	if err := e.runsc(ctx, spec.ID, "create", "--bundle", sb.dir, "--pid-file", filepath.Join(sb.dir, "pid"), spec.ID); err != nil {
		return err
	}
	e.mu.Lock()
	e.prepared[spec.ID] = spec.Hostname
	e.preparedNS[spec.ID] = spec.NetNS
	e.mu.Unlock()
	return nil
}

func (e *Engine) setIdentity(ctx context.Context, sb engine.Sandbox, hostname string) error {
	ch, err := sb.Agent().Open(ctx, wire.Request{Op: wire.OpIdentity, Hostname: hostname})
	if err != nil {
		return err
	}
	exit, err := ch.Wait(ctx)
	if err == nil {
		err = agent.ExitError(exit)
	}
	return err
}

// layout makes a sandbox's directory, bundle and agent socket.
func (e *Engine) layout(ctx context.Context, spec engine.Spec) (_ *sandbox, err error) {
	if len(spec.ID) == 0 || strings.ContainsAny(spec.ID, "/.") {
		return nil, errdefs.New(errdefs.InvalidArgument, "bad sandbox id %q", spec.ID)
	}
	dir := e.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, errdefs.New(errdefs.AlreadyExists, "sandbox %s already exists", spec.ID)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
		}
	}()
	for _, d := range []string{"run", "upper"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if err := e.writeBundle(spec); err != nil {
		return nil, err
	}
	return e.listen(spec.ID)
}

// start boots a sandbox (boot runs runsc run/start or restore), prepared
// or not, and waits for its agent.
func (e *Engine) start(ctx context.Context, spec engine.Spec, restore bool, boot func(dir string, prepared bool) error) (_ engine.Sandbox, err error) {
	e.mu.Lock()
	hostname, prepared := e.prepared[spec.ID]
	preparedNS := e.preparedNS[spec.ID]
	delete(e.prepared, spec.ID)
	delete(e.preparedNS, spec.ID)
	sb := e.live[spec.ID]
	e.mu.Unlock()
	if prepared && preparedNS != spec.NetNS {
		// Prepared in another network: of no use.
		if err := e.Destroy(ctx, spec.ID); err != nil {
			return nil, err
		}
		prepared = false
	}
	if !prepared {
		if sb, err = e.layout(ctx, spec); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			if derr := e.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup: %w", derr))
			}
		}
	}()
	t0 := time.Now()
	if err := boot(sb.dir, prepared); err != nil {
		return nil, err
	}
	t1 := time.Now()
	if err := e.waitReady(ctx, sb); err != nil {
		return nil, err
	}
	t2 := time.Now()
	// The pid file spares a `runsc state` call (a process start, ~15 ms).
	if b, err := os.ReadFile(filepath.Join(sb.dir, "pid")); err == nil {
		sb.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if sb.pid == 0 {
		sb.pid = e.statePID(ctx, spec.ID)
	}
	e.watch(sb)
	t3 := time.Now()
	defer func() {
		e.cfg.Log.Debug("sandbox started", "sandbox", spec.ID, "prepared", prepared, "restore", restore,
			"boot", t1.Sub(t0), "agent", t2.Sub(t1), "state", t3.Sub(t2), "identity", time.Since(t3))
	}()
	// A restored copy still has its checkpoint's hostname, a prepared one
	// the hostname it was prepared with.
	if restore || (prepared && hostname != spec.Hostname) {
		if err := e.setIdentity(ctx, sb, spec.Hostname); err != nil {
			return nil, fmt.Errorf("set hostname: %w", err)
		}
	}
	return sb, nil
}

// Checkpoint implements engine.Snapshotter.
func (e *Engine) Checkpoint(ctx context.Context, id, image string, leaveRunning bool) error {
	e.mu.Lock()
	sb := e.live[id]
	e.mu.Unlock()
	if sb == nil {
		return errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	if err := os.MkdirAll(image, 0o700); err != nil {
		return err
	}
	// The agent must not be connected while the checkpoint is taken: stop
	// accepting, then ask it to hang up and redial fast.
	t0 := time.Now()
	sb.closeListener()
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := sb.client.Quiesce(qctx)
	cancel()
	t1 := time.Now()
	defer func() {
		e.cfg.Log.Debug("checkpoint", "sandbox", id, "leave_running", leaveRunning, "quiesce", t1.Sub(t0), "total", time.Since(t0))
	}()
	// Without leaveRunning the sandbox stops by our hand: not an exit to
	// report.
	sb.expectExit.Store(!leaveRunning)
	if err == nil {
		args := []string{"checkpoint", "--image-path", image}
		if leaveRunning {
			args = append(args, "--leave-running")
		}
		err = e.runsc(ctx, id, append(args, id)...)
	}
	if err != nil {
		sb.expectExit.Store(false)
	}
	if leaveRunning || err != nil {
		// Running on (or still running after a failure): take the agent
		// back. It redials within a millisecond; calls wait for it (Open
		// waits for a connection), so the snapshot need not.
		if aerr := e.accept(sb); aerr != nil {
			return errors.Join(err, aerr)
		}
	}
	return err
}

func (e *Engine) waitReady(ctx context.Context, sb *sandbox) error {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ReadyTimeout)
	defer cancel()
	if err := sb.client.Ready(rctx); err != nil {
		return fmt.Errorf("sandbox %s: agent did not connect within %s (see %s): %w", sb.id, e.cfg.ReadyTimeout, filepath.Join(sb.dir, "runsc.log"), err)
	}
	return nil
}

// listen opens the sandbox's agent socket and accepts agent connections on
// it for as long as the sandbox lives.
func (e *Engine) listen(id string) (*sandbox, error) {
	dir := e.dir(id)
	sb := &sandbox{id: id, dir: dir, client: agent.NewClient(), exited: make(chan struct{}), stopped: make(chan struct{})}
	if err := e.accept(sb); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if old := e.live[id]; old != nil {
		old.stop()
	}
	e.live[id] = sb
	e.mu.Unlock()
	return sb, nil
}

// accept (re)opens sb's agent socket and serves agent connections on it
// until the listener is closed.
func (e *Engine) accept(sb *sandbox) error {
	path := filepath.Join(sb.dir, "run", "agent.sock")
	_ = os.Remove(path) // a stale socket from a previous daemon or listener
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("agent socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	sb.mu.Lock()
	sb.ln = ln
	sb.mu.Unlock()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				if err := sb.client.Serve(nc); err != nil && !errors.Is(err, net.ErrClosed) {
					e.cfg.Log.Debug("agent connection ended", "sandbox", sb.id, "err", err)
				}
			}()
		}
	}()
	return nil
}

// closeListener stops accepting agent connections and removes the socket,
// so an agent's dials fail until accept runs again.
func (sb *sandbox) closeListener() {
	sb.mu.Lock()
	ln := sb.ln
	sb.mu.Unlock()
	if ln != nil {
		ln.Close()
		_ = os.Remove(filepath.Join(sb.dir, "run", "agent.sock"))
	}
}

func (s *sandbox) stop() {
	s.stopOnce.Do(func() { close(s.stopped) })
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	s.mu.Unlock()
	s.client.Close()
}

func (e *Engine) writeBundle(spec engine.Spec) error {
	memory := int64(spec.MemoryMiB) << 20
	period := uint64(100000)
	var cpu map[string]any
	if spec.CPUs > 0 {
		cpu = map[string]any{"quota": int64(spec.CPUs * float64(period)), "period": period}
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "HOSTNAME=" + spec.Hostname, "LANG=C.UTF-8"}, spec.Env...)
	env = append(env, agentSockEnv+"="+guestSocket)
	if spec.Workdir != "" {
		env = append(env, "CLADE_AGENT_WORKDIR="+spec.Workdir)
	}
	if spec.User != "" {
		env = append(env, "CLADE_AGENT_USER="+spec.User)
	}
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
		// For the agent only: it drops this from the bounding set at start.
		"CAP_SYS_ADMIN"}
	netns, mounts, err := e.networkBundle(spec)
	if err != nil {
		return err
	}
	resources := map[string]any{"pids": map[string]any{"limit": 32768}}
	if memory > 0 {
		resources["memory"] = map[string]any{"limit": memory}
	}
	if cpu != nil {
		resources["cpu"] = cpu
	}
	spec2 := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": []string{guestAgent},
			"env":  env,
			"cwd":  "/",
			"user": map[string]any{"uid": 0, "gid": 0},
			"capabilities": map[string]any{
				"bounding": caps, "effective": caps, "permitted": caps,
			},
			"rlimits": []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}},
		},
		"root":     map[string]any{"path": spec.RootFS, "readonly": false},
		"hostname": spec.Hostname,
		"mounts": append([]map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": guestBinDir, "type": "bind", "source": e.binDir, "options": []string{"rbind", "ro"}},
			{"destination": guestRunDir, "type": "bind", "source": filepath.Join(e.dir(spec.ID), "run"), "options": []string{"rbind", "rw"}},
		}, mounts...),
		"linux": map[string]any{
			"cgroupsPath": "/clade/" + spec.ID,
			"resources":   resources,
			"namespaces": []map[string]any{
				{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, netns,
			},
		},
	}
	b, err := json.MarshalIndent(spec2, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.dir(spec.ID), "config.json"), b, 0o600)
}

// netnsFile in a sandbox's directory names the network namespace it runs
// in; runsc calls for the sandbox then use --network=sandbox.
const netnsFile = "netns"

// networkBundle returns the bundle's network namespace entry and the
// mounts the network needs (/etc/resolv.conf naming spec.DNS), and records
// the namespace for globalFlags.
func (e *Engine) networkBundle(spec engine.Spec) (map[string]any, []map[string]any, error) {
	if spec.NetNS == "" {
		return map[string]any{"type": "network"}, nil, nil
	}
	dir := e.dir(spec.ID)
	if err := os.WriteFile(filepath.Join(dir, netnsFile), []byte(spec.NetNS), 0o600); err != nil {
		return nil, nil, err
	}
	var mounts []map[string]any
	if len(spec.DNS) > 0 {
		var b strings.Builder
		for _, ns := range spec.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", ns)
		}
		// Same bytes in every sandbox of one network: a restored copy's
		// page cache of it stays true.
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return nil, nil, err
		}
		mounts = append(mounts, map[string]any{"destination": "/etc/resolv.conf", "type": "bind", "source": p, "options": []string{"bind", "ro"}})
	}
	return map[string]any{"type": "network", "path": spec.NetNS}, mounts, nil
}

type runscState struct {
	ID     string `json:"id"`
	PID    int    `json:"pid"`
	Status string `json:"status"`
}

// state asks runsc about id. It returns NotFound when runsc knows no such
// container.
func (e *Engine) state(ctx context.Context, id string) (runscState, error) {
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(id), "state", id)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return runscState{}, errdefs.New(errdefs.NotFound, "sandbox %s is not running", id)
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return runscState{}, fmt.Errorf("runsc state %s: %w", id, err)
	}
	return st, nil
}

func (e *Engine) statePID(ctx context.Context, id string) int {
	st, err := e.state(ctx, id)
	if err != nil {
		return 0
	}
	return st.PID
}

// Attach implements engine.Engine.
func (e *Engine) Attach(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	st, err := e.state(ctx, spec.ID)
	if err != nil {
		return nil, err
	}
	if st.Status != "running" {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s is %s, not running", spec.ID, st.Status)
	}
	sb, err := e.listen(spec.ID)
	if err != nil {
		return nil, err
	}
	if err := e.waitReady(ctx, sb); err != nil {
		return nil, err
	}
	sb.pid = st.PID
	e.watch(sb)
	return sb, nil
}

// Destroy implements engine.Engine.
func (e *Engine) Destroy(ctx context.Context, id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return errdefs.New(errdefs.InvalidArgument, "bad sandbox id %q", id)
	}
	e.mu.Lock()
	sb := e.live[id]
	delete(e.live, id)
	delete(e.prepared, id)
	delete(e.preparedNS, id)
	e.mu.Unlock()
	if sb != nil {
		sb.stop()
	}
	dir := e.dir(id)
	if !fileExists(dir) {
		e.killProcesses(dir + "/")
		return nil
	}
	// One call: delete --force kills with SIGKILL. Only when it fails is
	// it worth asking whether there was anything to delete (each runsc call
	// is a process start, ~15 ms).
	if err := e.runsc(ctx, id, "delete", "--force", id); err != nil {
		if _, serr := e.state(ctx, id); !errdefs.IsNotFound(serr) {
			return err
		}
	}
	// Whatever runsc lost track of (a create killed half way) still names
	// the sandbox's directory on its command line: no process outlives it.
	e.killProcesses(dir + "/")
	return os.RemoveAll(dir)
}

// Close implements engine.Engine.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, sb := range e.live {
		sb.stop()
		delete(e.live, id)
	}
	return nil
}

// List implements engine.Engine.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	ents, err := os.ReadDir(e.sbRoot)
	if err != nil {
		return nil, err
	}
	for _, d := range ents {
		seen[d.Name()] = true
	}
	// runsc's own records, in case a bundle dir was lost.
	ents, _ = os.ReadDir(e.runRoot)
	for _, d := range ents {
		if name, ok := strings.CutSuffix(d.Name(), ".state"); ok {
			if i := strings.LastIndex(name, "_"); i >= 0 {
				name = name[i+1:]
			}
			seen[name] = true
		}
	}
	// And processes of sandboxes whose directory is gone.
	prefix := e.sbRoot + "/"
	for _, p := range e.processes(prefix) {
		rest := p.cmdline[strings.Index(p.cmdline, prefix)+len(prefix):]
		if id, _, ok := strings.Cut(rest, "/"); ok && id != "" {
			seen[id] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// killProcesses SIGKILLs every process whose command line contains s and
// waits (up to 5 s each, through a pidfd) until it is gone.
func (e *Engine) killProcesses(s string) {
	for _, p := range e.processes(s) {
		fd, err := unix.PidfdOpen(p.pid, 0)
		if err != nil {
			continue // already gone
		}
		if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
		}
		unix.Close(fd)
		e.cfg.Log.Debug("killed a leftover sandbox process", "pid", p.pid)
	}
}

type proc struct {
	pid     int
	cmdline string
}

// processes lists the processes whose command line contains s.
func (e *Engine) processes(s string) []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, proc{pid, string(b)})
		}
	}
	return out
}

// PIDs returns host pids of runsc processes that belong to this engine's
// state dir, for leak checks.
func (e *Engine) PIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), e.runRoot+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
