// Package gvisor is the clade engine that runs sandboxes under gVisor's runsc.
//
// Every runsc call gets stdio on files, never pipes: `runsc run --detach`
// hands its stdio to the sandbox, so reading a pipe to EOF would hang until
// the sandbox dies. Every call for one id uses the same global flags, and ids
// have a fixed length because runsc matches container ids by prefix.
package gvisor

import (
	"bytes"
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

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/gvisor/bundle"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
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
	// UpperRoot, when set, holds each sandbox's upper layer (what it
	// writes) in UpperRoot/<id> instead of its state directory: the daemon
	// points it into an encrypted directory (package atrest).
	UpperRoot string
	// ReadyTimeout bounds how long Create waits for the agent; 30s if zero.
	ReadyTimeout time.Duration
	// CheckpointFlags and RestoreFlags are added to runsc checkpoint and
	// runsc restore (e.g. --exclude-committed-zero-pages, --background):
	// BenchmarkRestoreFlags compares them.
	CheckpointFlags, RestoreFlags []string
	// NoDirectControl makes checkpoints run `runsc checkpoint` even with
	// a runsc whose control protocol the engine knows (control.go).
	NoDirectControl bool
	Log             *slog.Logger
	// CrashAt names a point at which the process kills itself with
	// SIGKILL, for crash tests ("gvisor-view-mounted": a sandbox's root
	// view is mounted on the host, its runsc call not yet made).
	CrashAt string
}

// Engine drives runsc.
type Engine struct {
	cfg     Config
	runRoot string
	sbRoot  string
	binDir  string

	mu   sync.Mutex
	live map[string]*sandbox
	// versionMu guards version, runsc's, read once (RunscVersion).
	versionMu sync.Mutex
	version   string
	// prepared maps ids of created-not-started containers to the hostname
	// they were created with.
	prepared map[string]string
	// disk caches each sandbox's disk cap (see diskMiB).
	disk map[string]int
	// preparedNS holds the network namespace a prepared container was
	// created in: runsc takes the network when it creates the sandbox.
	preparedNS map[string]string

	directOnce sync.Once
	directOK   bool // see direct
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
		binDir: filepath.Join(cfg.StateDir, "bin"), live: map[string]*sandbox{}, prepared: map[string]string{}, disk: map[string]int{},
		preparedNS: map[string]string{}}
	for _, d := range []string{e.runRoot, e.sbRoot, e.binDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := e.dropViews(); err != nil {
		return nil, fmt.Errorf("detach the root views a previous daemon left: %w", err)
	}
	if err := e.installAgent(); err != nil {
		return nil, err
	}
	// Learn runsc's version now rather than on the first checkpoint's path.
	go e.direct(context.Background())
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

// runscVersionWait bounds `runsc --version`: callers queue behind it (the
// daemon's first read has no deadline), so a runsc that hangs would hang
// every health call.
var runscVersionWait = 10 * time.Second

// RunscVersion returns `runsc --version`'s first line.
// It runs runsc once; a run that failed is tried again at the next call.
func (e *Engine) RunscVersion(ctx context.Context) string {
	e.versionMu.Lock()
	defer e.versionMu.Unlock()
	if e.version != "" {
		return e.version
	}
	ctx, cancel := context.WithTimeout(ctx, runscVersionWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.cfg.Runsc, "--version").Output()
	if err != nil {
		return "unknown"
	}
	e.version, _, _ = strings.Cut(string(out), "\n")
	return e.version
}

type sandbox struct {
	id     string
	dir    string
	pid    int
	client *guest.Conn
	mu     sync.Mutex
	ln     net.Listener
	// expectExit marks an exit we caused (a checkpoint that stops it).
	expectExit atomic.Bool
	exited     chan struct{}
	reason     string
	// lastReject is when a refused connection was last logged (UnixNano).
	lastReject atomic.Int64

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

func (s *sandbox) ID() string          { return s.id }
func (s *sandbox) Guest() *guest.Conn  { return s.client }
func (s *sandbox) PID() int            { return s.pid }
func (e *Engine) dir(id string) string { return filepath.Join(e.sbRoot, id) }

// Holds implements multi.Holder: id has a sandbox directory here.
func (e *Engine) Holds(id string) bool {
	_, err := os.Lstat(e.dir(id))
	return err == nil
}

// IsCheckpoint implements multi.CheckpointOwner: dir holds runsc's state
// file, so a daemon whose default engine is another still restores gVisor
// snapshots and sleeping sandboxes with gVisor.
func (e *Engine) IsCheckpoint(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, "checkpoint.img"))
	return err == nil
}
func (e *Engine) upper(id string) string {
	if e.cfg.UpperRoot != "" {
		return filepath.Join(e.cfg.UpperRoot, id)
	}
	return filepath.Join(e.dir(id), "upper")
}

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
		// Set-user-ID executables (sudo, su, ping) elevate as they do on
		// Linux, inside the sandbox: to the sandbox's own root, which any
		// sandbox process may already be, and never past gVisor's
		// boundary. runsc ignores the bits without it (E2B's base runs
		// `sudo` as its user).
		"--allow-suid",
		"--overlay2", e.overlay(id),
		"--log-format", "text",
	}
}

// overlay is id's --overlay2: the root's upper layer is a tmpfs backed by
// a filestore file in the sandbox's upper dir, and its size= is the disk
// cap: writes past it fail with ENOSPC inside and df shows it. (runsc's
// rootfs size annotation would do the same, but restore refuses a bundle
// whose annotations differ from the checkpoint's, and the upper dir's path
// differs for every child.)
func (e *Engine) overlay(id string) string {
	o := "root:dir=" + e.upper(id)
	if mib := e.diskMiB(id); mib > 0 {
		o += fmt.Sprintf(",size=%dm", mib)
	}
	return o
}

// diskCapFile holds a sandbox's DiskMiB in its directory, so that every
// later runsc call about it, also from a restarted engine, passes the
// same flags.
const diskCapFile = "disk-mib"

func (e *Engine) diskMiB(id string) int {
	e.mu.Lock()
	mib, ok := e.disk[id]
	e.mu.Unlock()
	if ok {
		return mib
	}
	b, err := os.ReadFile(filepath.Join(e.dir(id), diskCapFile))
	if err != nil {
		return 0
	}
	mib, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	e.mu.Lock()
	e.disk[id] = mib
	e.mu.Unlock()
	return mib
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
	err = cmd.Start()
	if err == nil {
		if args[0] == "restore" {
			e.crashPoint("gvisor-restore-started")
		}
		err = cmd.Wait()
	}
	if err != nil {
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
	return e.start(ctx, spec, "", false, func(dir string, prepared bool) error {
		if prepared {
			return e.runsc(ctx, spec.ID, "start", spec.ID)
		}
		return e.runsc(ctx, spec.ID, "run", "--bundle", dir, "--pid-file", filepath.Join(dir, "pid"), "--detach", spec.ID)
	})
}

// Restore implements engine.Snapshotter.
func (e *Engine) Restore(ctx context.Context, spec engine.Spec, image string) (engine.Sandbox, error) {
	return e.start(ctx, spec, image, true, func(dir string, _ bool) error {
		// Into the prepared (created, not started) container if there is
		// one: that halves the restore.
		args := append([]string{"restore", "--image-path", image, "--bundle", dir, "--pid-file", filepath.Join(dir, "pid"), "--detach"}, e.cfg.RestoreFlags...)
		return e.runsc(ctx, spec.ID, append(args, spec.ID)...)
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
	err = e.runsc(ctx, spec.ID, "create", "--bundle", sb.dir, "--pid-file", filepath.Join(sb.dir, "pid"), spec.ID)
	// The gofer holds its root now: the host lets go of the view.
	if err := errors.Join(err, e.dropView(spec.ID)); err != nil {
		return err
	}
	e.mu.Lock()
	e.prepared[spec.ID] = spec.Hostname
	e.preparedNS[spec.ID] = spec.NetNS
	e.mu.Unlock()
	return nil
}

// layout makes a sandbox's directory, bundle and agent socket.
func (e *Engine) layout(ctx context.Context, spec engine.Spec) (_ *sandbox, err error) {
	if len(spec.ID) == 0 || strings.ContainsAny(spec.ID, "/.") {
		return nil, errdefs.New(errdefs.InvalidArgument, "bad sandbox id %q", spec.ID)
	}
	dir := e.dir(spec.ID)
	if !fileExists(dir) {
		// No sandbox of the id: what runs of it is orphaned (orphans.go).
		if err := e.endOrphans(spec.ID); err != nil {
			return nil, err
		}
	}
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
	for _, d := range []string{filepath.Join(dir, "run"), e.upper(spec.ID)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if spec.DiskMiB < 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "disk cap %d MiB: want 0 (none) or more", spec.DiskMiB)
	}
	if err := os.WriteFile(filepath.Join(dir, diskCapFile), []byte(strconv.Itoa(spec.DiskMiB)), 0o600); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.disk[spec.ID] = spec.DiskMiB
	e.mu.Unlock()
	if err := e.writeBundle(spec); err != nil {
		return nil, err
	}
	return e.listen(spec.ID)
}

// start boots a sandbox (boot runs runsc run/start or restore), prepared
// or not, and waits for its agent.
func (e *Engine) start(ctx context.Context, spec engine.Spec, image string, restore bool, boot func(dir string, prepared bool) error) (_ engine.Sandbox, err error) {
	e.mu.Lock()
	_, prepared := e.prepared[spec.ID]
	preparedNS := e.preparedNS[spec.ID]
	delete(e.prepared, spec.ID)
	delete(e.preparedNS, spec.ID)
	sb := e.live[spec.ID]
	e.mu.Unlock()
	if prepared && (e.diskMiB(spec.ID) != spec.DiskMiB || preparedNS != spec.NetNS || len(spec.Mounts) > 0) {
		// runsc fixed the disk cap, the network and the mounts (volumes)
		// when it created the container: start afresh rather than with
		// the wrong ones.
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
	// Before the agent can dial: a fresh boot's first hello is taken on
	// trust, a restored agent must present its snapshot's key.
	auth := guest.Auth{Fresh: !restore, Save: guest.KeySaver(filepath.Join(sb.dir, guest.KeyFile))}
	if restore {
		if auth.Keys, auth.Legacy, err = guest.LoadKeys(filepath.Join(image, guest.KeyFile)); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", image, err)
		}
		if auth.Legacy {
			e.cfg.Log.Warn("restoring a snapshot older than agent keys: its agent cannot prove itself, so a process in the sandbox could pose as it; take the snapshot again to close that", "sandbox", spec.ID, "snapshot", image)
		}
		auth.Restored = true
	}
	sb.client.Authenticate(auth)
	t0 := time.Now()
	err = boot(sb.dir, prepared)
	// The gofer holds its root now (or none runs): the host lets go of
	// the view, if the sandbox has one.
	if err := errors.Join(err, e.dropView(spec.ID)); err != nil {
		return nil, err
	}
	t1 := time.Now()
	if restore {
		e.crashPoint("gvisor-restore-booted")
	}
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
	e.cfg.Log.Debug("sandbox started", "sandbox", spec.ID, "prepared", prepared, "restore", restore,
		"boot", t1.Sub(t0), "agent", t2.Sub(t1), "state", t3.Sub(t2))
	return sb, nil
}

// Checkpoint implements engine.Snapshotter: it checkpoints id into image;
// then, unless leaveRunning, runs ctx's seal (engine.WithSeal) while the
// sandbox still runs, and stops it.
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
	var t2, t3 time.Time
	defer func() {
		e.cfg.Log.Debug("checkpoint", "sandbox", id, "leave_running", leaveRunning, "quiesce", t1.Sub(t0), "runsc", t2.Sub(t1), "kill", t3.Sub(t2), "total", time.Since(t0))
	}()
	// Always --leave-running: a checkpoint that fails half way (a full
	// disk) must leave the sandbox as it was, and runsc's stopping
	// checkpoint kills the sandbox on failure too. The sandbox stops only
	// once the image is complete.
	if err == nil {
		// The restored agents present this key (see guest.Auth).
		err = guest.WriteKeys(filepath.Join(image, guest.KeyFile), sb.client.Keys())
	}
	if err == nil {
		if len(e.cfg.CheckpointFlags) == 0 && e.direct(ctx) {
			err = e.checkpointDirect(ctx, id, image)
		} else {
			args := append([]string{"checkpoint", "--leave-running", "--image-path", image}, e.cfg.CheckpointFlags...)
			err = e.runsc(ctx, id, append(args, id)...)
		}
		if err != nil {
			// runsc keeps a failed image's state file open in the running
			// sandbox: empty the files, or removing them frees no space.
			truncateAll(image)
		}
		err = classifyCheckpointErr(err, image)
	}
	if err == nil && !leaveRunning {
		// The caller marks the image whole while the sandbox still runs.
		err = engine.Seal(ctx)
	}
	t2 = time.Now()
	t3 = t2
	if err == nil && !leaveRunning {
		// Stopped by our hand: not an exit to report.
		sb.expectExit.Store(true)
		if err = e.kill(ctx, sb); err != nil {
			sb.expectExit.Store(false)
		}
		t3 = time.Now()
	}
	if leaveRunning || err != nil {
		// Running on (or still running after a failure): take the agent
		// back. It redials within a millisecond; calls wait for it (Open
		// waits for a connection), so the snapshot need not.
		if aerr := e.accept(sb); aerr != nil {
			// A full disk can refuse the socket's inode: without a retry
			// the agent could never come back, even once there is room.
			e.cfg.Log.Warn("agent socket: retrying until it can be made", "sandbox", id, "err", aerr)
			go e.acceptLater(sb)
			return errors.Join(err, aerr)
		}
	}
	return err
}

// kill stops a sandbox whose image is complete: SIGKILL to its sandbox
// process, waiting (up to 5 s) until it is gone and its memory free. The
// container's runsc record and its gofer go with Destroy. Without a pid it
// asks `runsc kill`, a process start (15 ms on an idle host, several times
// that on a busy one).
func (e *Engine) kill(ctx context.Context, sb *sandbox) error {
	if sb.pid > 0 {
		if fd, err := unix.PidfdOpen(sb.pid, 0); err == nil {
			defer unix.Close(fd)
			// The fd holds the process it was opened on; its command line
			// (which names the sandbox's directory) says it is ours and
			// not a later process that took a dead sandbox's pid.
			cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(sb.pid), "cmdline"))
			if !strings.Contains(string(cmdline), "\x00--bundle="+sb.dir+"\x00") {
				return e.runsc(ctx, sb.id, "kill", sb.id, "KILL")
			}
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err == nil || errors.Is(err, unix.ESRCH) {
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
					if n > 0 || (err != nil && err != unix.EINTR) {
						return nil
					}
				}
				return fmt.Errorf("sandbox %s: its process %d outlived SIGKILL for 5 s", sb.id, sb.pid)
			}
		}
	}
	return e.runsc(ctx, sb.id, "kill", sb.id, "KILL")
}

// acceptLater retries accept until it succeeds or the sandbox stops; the
// agent redials meanwhile.
func (e *Engine) acceptLater(sb *sandbox) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-sb.stopped:
			return
		case <-t.C:
		}
		if e.accept(sb) == nil {
			select {
			case <-sb.stopped: // stopped meanwhile: its listener must not stay
				sb.closeListener()
			default:
				e.cfg.Log.Info("agent socket made again", "sandbox", sb.id)
			}
			return
		}
	}
}

// truncateAll empties every regular file in dir.
func truncateAll(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, d := range ents {
		if d.Type().IsRegular() {
			_ = os.Truncate(filepath.Join(dir, d.Name()), 0)
		}
	}
}

// classifyCheckpointErr makes a checkpoint that ran out of disk a
// ResourceExhausted error that says so.
func classifyCheckpointErr(err error, image string) error {
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "no space left on device") {
		return err
	}
	free := "no"
	var st unix.Statfs_t
	if unix.Statfs(image, &st) == nil {
		free = strconv.FormatUint(st.Bavail*uint64(st.Bsize)>>20, 10)
	}
	return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("the disk holding %s is full: the checkpoint did not fit (%s MiB are free without it); free some space (remove snapshots or sleeping sandboxes) and retry; the sandbox is still running: %w", image, free, err))
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
	return e.listenAuth(id, guest.Auth{Fresh: true, Save: guest.KeySaver(filepath.Join(e.dir(id), guest.KeyFile))})
}

// listenAuth is listen for an agent that authenticates as auth says.
func (e *Engine) listenAuth(id string, auth guest.Auth) (*sandbox, error) {
	dir := e.dir(id)
	sb := &sandbox{id: id, dir: dir, client: guest.NewConn(), exited: make(chan struct{}), stopped: make(chan struct{})}
	sb.client.Authenticate(auth)
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
				err := sb.client.Serve(nc)
				switch {
				case guest.IsRejected(err):
					// Something else in the sandbox dialled the agent's
					// socket. At most one line a second, however often.
					if now := time.Now().UnixNano(); now-sb.lastReject.Load() > int64(time.Second) {
						sb.lastReject.Store(now)
						e.cfg.Log.Warn("refused a connection to the agent's socket that is not the agent's", "sandbox", sb.id, "err", err)
					}
				case err != nil && !errors.Is(err, net.ErrClosed):
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
	s.client.Close(nil)
}

func (e *Engine) writeBundle(spec engine.Spec) error {
	env := append(append([]string{}, spec.Env...), agentSockEnv+"="+guestSocket)
	if spec.Workdir != "" {
		env = append(env, "CLADE_AGENT_WORKDIR="+spec.Workdir)
	}
	if spec.User != "" {
		env = append(env, "CLADE_AGENT_USER="+spec.User)
	}
	netMounts, err := e.networkBundle(spec)
	if err != nil {
		return err
	}
	mounts := append([]bundle.Mount{
		{Source: e.binDir, Destination: guestBinDir, ReadOnly: true},
		// Read-only too: the agent only dials the host's socket there,
		// and a writable host directory would bypass the disk cap.
		{Source: filepath.Join(e.dir(spec.ID), "run"), Destination: guestRunDir, ReadOnly: true},
	}, append(netMounts, volumeMounts(spec)...)...)
	rootfs := spec.RootFS
	if needsView(rootfs, mounts) {
		if rootfs, err = e.mountView(spec.ID, rootfs); err != nil {
			return err
		}
		e.crashPoint("gvisor-view-mounted")
	}
	return bundle.Write(e.dir(spec.ID), bundle.Spec{
		Args:      []string{guestAgent},
		Env:       env,
		Hostname:  spec.Hostname,
		RootFS:    rootfs,
		Cgroup:    "/clade/" + spec.ID,
		MemoryMiB: spec.MemoryMiB,
		CPUs:      spec.CPUs,
		// For the agent only: it drops this from the bounding set at start.
		ExtraCaps: []string{"CAP_SYS_ADMIN"},
		Mounts:    mounts,
		NetNS:     spec.NetNS,
	})
}

// volumeMounts are spec's volumes as bind mounts. runsc's gofer serves
// them; a checkpoint records them by destination, so a restore may serve
// another source there.
func volumeMounts(spec engine.Spec) []bundle.Mount {
	var ms []bundle.Mount
	for _, m := range spec.Mounts {
		ms = append(ms, bundle.Mount{Source: m.Source, Destination: m.Destination, ReadOnly: m.ReadOnly, Tmpfs: m.Type == engine.MountTmpfs})
	}
	return ms
}

// netnsFile in a sandbox's directory names the network namespace it runs
// in; runsc calls for the sandbox then use --network=sandbox.
const netnsFile = "netns"

// networkBundle records the sandbox's network namespace for globalFlags
// and returns the mounts the network needs (/etc/resolv.conf naming
// spec.DNS).
func (e *Engine) networkBundle(spec engine.Spec) ([]bundle.Mount, error) {
	if spec.NetNS == "" {
		return nil, nil
	}
	dir := e.dir(spec.ID)
	if err := os.WriteFile(filepath.Join(dir, netnsFile), []byte(spec.NetNS), 0o600); err != nil {
		return nil, err
	}
	if len(spec.DNS) == 0 {
		return nil, nil
	}
	var b strings.Builder
	for _, ns := range spec.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	// Same bytes in every sandbox of one network: a restored copy's page
	// cache of it stays true.
	p := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return []bundle.Mount{{Source: p, Destination: "/etc/resolv.conf", ReadOnly: true}}, nil
}

type runscState struct {
	ID     string `json:"id"`
	PID    int    `json:"pid"`
	Status string `json:"status"`
}

// stateWait bounds `runsc state`, which asks the sandbox process itself
// and waits for it without end when that process is frozen (SIGSTOP, a
// cgroup freezer) or wedged: the daemon's start (Reconcile) and settle's
// retries, whose contexts have no deadline, would hang on it for good,
// holding the sandbox's lock (a `clade rm` of it would hang too).
var stateWait = 10 * time.Second

// state asks runsc about id. It returns NotFound when runsc knows no such
// container, and Unavailable when runsc could not say (it failed
// otherwise, or ctx ended first, or stateWait passed): a caller must not
// take that for gone.
func (e *Engine) state(ctx context.Context, id string) (runscState, error) {
	ctx, cancel := context.WithTimeout(ctx, stateWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(id), "state", id)...)
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else if unknownContainer(msg) {
			return runscState{}, errdefs.New(errdefs.NotFound, "sandbox %s is not running", id)
		}
		return runscState{}, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("runsc state %s: %w: %s", id, err, msg))
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return runscState{}, fmt.Errorf("runsc state %s: %w", id, err)
	}
	return st, nil
}

// unknownContainer says whether runsc's error message msg means it has no
// record of the container ("loading container: file does not exist").
func unknownContainer(msg string) bool {
	msg = strings.ToLower(msg)
	for _, s := range []string{"does not exist", "no such file", "not found"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func (e *Engine) statePID(ctx context.Context, id string) int {
	st, err := e.state(ctx, id)
	if err != nil {
		return 0
	}
	return st.PID
}

// Attach implements engine.Engine. A sandbox it finds paused (runsc's
// "paused") or frozen (its cgroup's freezer) is thawed first: the daemon
// never leaves a sandbox of a running record so, but one killed between a
// pause and its resume would, and the sandbox would never run again (its
// agent never redials, its clock stands still).
func (e *Engine) Attach(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	// Before `runsc state`, which waits without end for a frozen sandbox
	// process.
	if thawed, err := thawCgroup(spec.ID); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("sandbox %s: thaw its cgroup: %w", spec.ID, err))
	} else if thawed {
		e.cfg.Log.Warn("attach: thawed a sandbox whose cgroup was frozen", "sandbox", spec.ID)
	}
	st, err := e.state(ctx, spec.ID)
	if err != nil {
		return nil, err
	}
	if st.Status == "paused" {
		if err := e.runsc(ctx, spec.ID, "resume", spec.ID); err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("sandbox %s is paused and did not resume: %w", spec.ID, err))
		}
		e.cfg.Log.Warn("attach: resumed a paused sandbox", "sandbox", spec.ID)
		st.Status = "running"
	}
	if st.Status != "running" {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s is %s, not running", spec.ID, st.Status)
	}
	keys, legacy, err := guest.LoadKeys(filepath.Join(e.dir(spec.ID), guest.KeyFile))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("sandbox %s runs, but its agent cannot be told from an impostor: %w", spec.ID, err))
	}
	if legacy {
		e.cfg.Log.Warn("sandbox started by an older clade: its agent cannot prove itself, so a process in it could pose as it; recreate it to close that", "sandbox", spec.ID)
	}
	sb, err := e.listenAuth(spec.ID, guest.Auth{Keys: keys, Legacy: legacy, Save: guest.KeySaver(filepath.Join(e.dir(spec.ID), guest.KeyFile))})
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		// The sandbox runs; only its agent socket does not fit.
		return nil, errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("sandbox %s runs, but the disk is too full to make its agent socket: free some space: %w", spec.ID, err))
	}
	if err != nil {
		return nil, err
	}
	if err := e.waitReady(ctx, sb); err != nil {
		// It runs, but its agent did not answer in time (a loaded host, a
		// frozen sandbox, ctx ended): a later attach may well succeed,
		// and the caller must not destroy it for this.
		e.mu.Lock()
		if e.live[spec.ID] == sb {
			delete(e.live, spec.ID)
		}
		e.mu.Unlock()
		sb.stop()
		return nil, errdefs.Wrap(errdefs.Unavailable, err)
	}
	sb.pid = st.PID
	e.watch(sb)
	return sb, nil
}

// thawCgroup undoes a freeze of sandbox id's cgroup (/clade/ID: the v1
// freezer's freezer.state, v2's cgroup.freeze) and says whether there was
// one. A cgroup that does not exist has nothing to thaw.
func thawCgroup(id string) (bool, error) {
	cg := cgroupsOnce()
	path, thawed := "", ""
	switch {
	case cg.freeze != "":
		path, thawed = filepath.Join(cg.freeze, "clade", id, "freezer.state"), "THAWED"
	case cg.v2 != "":
		path, thawed = filepath.Join(cg.v2, "clade", id, "cgroup.freeze"), "0"
	default:
		return false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if cur := strings.TrimSpace(string(b)); cur == thawed || cur == "" {
		return false, nil
	}
	return true, os.WriteFile(path, []byte(thawed), 0)
}

// deleteWait bounds `runsc delete --force` in Destroy.
var deleteWait = 30 * time.Second

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
	// The disk cap is forgotten when the directory goes (below).
	defer func() {
		e.mu.Lock()
		delete(e.disk, id)
		e.mu.Unlock()
	}()
	// A frozen cgroup's processes do not die of SIGKILL (cgroup v1) until
	// it is thawed.
	if _, err := thawCgroup(id); err != nil {
		e.cfg.Log.Warn("destroy: thawing the sandbox's cgroup", "sandbox", id, "err", err)
	}
	dir := e.dir(id)
	if !fileExists(dir) {
		_, err := e.endProcesses(id)
		return errors.Join(err, e.removeStateFiles(id), e.removeUpper(id))
	}
	// One call: delete --force kills with SIGKILL. Only when it fails is
	// it worth asking whether there was anything to delete (each runsc call
	// is a process start, ~15 ms).
	// Bounded: runsc waits without end for a frozen sandbox process (SIGSTOP,
	// a cgroup freezer), which the SIGKILLs below end all the same.
	dctx, cancel := context.WithTimeout(ctx, deleteWait)
	derr := e.runsc(dctx, id, "delete", "--force", id)
	cancel()
	if derr != nil {
		if _, serr := e.state(ctx, id); errdefs.IsNotFound(serr) {
			derr = nil
		}
	}
	// Whatever runsc lost track of (a create killed half way, a restore
	// orphaned by a killed daemon and still starting the sandbox's
	// processes), or failed to delete (seen under load: the sandbox then ran
	// on, unowned, after its directory was gone), still names the id under
	// this engine's runsc root, or the sandbox's directory, on its command
	// line: no process outlives it (orphans.go).
	n, err := e.endProcesses(id)
	if err != nil {
		return errors.Join(derr, err)
	}
	if n > 0 && derr == nil {
		e.cfg.Log.Warn("destroy: ended processes of the sandbox that runsc did not (a runsc call orphaned by a killed daemon)", "sandbox", id, "processes", n)
	}
	if derr != nil {
		e.cfg.Log.Warn("runsc delete failed; the sandbox's processes were killed instead", "sandbox", id, "err", derr)
	}
	// A start cut short may have left the root view mounted: removing
	// the directory would walk into it.
	if err := e.dropView(id); err != nil {
		return err
	}
	// Nor does runsc's record of it: a restore cut short by a daemon kill
	// leaves one naming a dead sandbox process, which the next restore of
	// the same id would try to reach ("connecting to control server at PID
	// N: connection refused").
	return errors.Join(e.removeStateFiles(id), e.removeUpper(id), os.RemoveAll(dir))
}

// removeUpper removes an upper layer kept outside the state directory.
func (e *Engine) removeUpper(id string) error {
	if e.cfg.UpperRoot == "" {
		return nil
	}
	return os.RemoveAll(e.upper(id))
}

// removeStateFiles removes runsc's state and lock files of container id
// ("<id>_sandbox:<sandbox>.state" and its ".lock"s) and its sandbox's
// control socket (runsc-<id>.sock): a sandbox killed before runsc could
// record it (an orphaned restore) leaves the socket bound to nobody, and
// the next sandbox of the id would bind its own elsewhere (runsc falls back
// to /var/run) while the engine dials this one.
func (e *Engine) removeStateFiles(id string) error {
	ents, err := os.ReadDir(e.runRoot)
	if err != nil {
		return nil
	}
	var errs []error
	for _, d := range ents {
		if strings.HasPrefix(d.Name(), id+"_sandbox:") || d.Name() == filepath.Base(e.controlSocket(id)) {
			if err := os.Remove(filepath.Join(e.runRoot, d.Name())); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Close implements engine.Engine. It also unmounts runsc's null-netns
// under the state dir, the empty network namespace runsc pins there for
// its gofers to share: running gofers hold the namespace by their own
// reference, runsc opens it through a file descriptor (an unmount racing a
// call does no harm), and the next call that finds it gone makes and pins
// a new one.
func (e *Engine) Close() error {
	e.mu.Lock()
	for id, sb := range e.live {
		sb.stop()
		delete(e.live, id)
	}
	e.mu.Unlock()
	return unmountNullNetNS(e.runRoot)
}

// unmountNullNetNS unmounts every null-netns bind mount stacked under
// root (concurrent runsc calls may each have pinned one).
func unmountNullNetNS(root string) error {
	return detachAll(filepath.Join(root, nullNetNS))
}

// nullNetNS is runsc's specutils.NullNetNSFilename.
const nullNetNS = "null-netns"

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
		if id, ok := stateFileID(d.Name()); ok {
			seen[id] = true
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

// stateFileID returns the container id of a runsc state file, named
// "<container>_sandbox:<sandbox>.state" (runsc/container/state_file.go;
// ids never contain '_' or ':').
func stateFileID(name string) (string, bool) {
	rest, ok := strings.CutSuffix(name, ".state")
	if !ok {
		return "", false
	}
	id, sandbox, ok := strings.Cut(rest, "_sandbox:")
	if !ok || id == "" || sandbox == "" || strings.ContainsAny(id, "_:/") {
		return "", false
	}
	return id, true
}

type proc struct {
	pid     int
	cmdline string
}

// processes lists the processes whose command line contains s.
func (e *Engine) processes(s string) []proc {
	return procsWhere(func(cmdline string) bool { return strings.Contains(cmdline, s) })
}

// procsWhere lists the processes, this one aside, whose command line (its
// arguments NUL-separated, as /proc has it) match takes.
func procsWhere(match func(cmdline string) bool) []proc {
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
		if err == nil && match(string(b)) {
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

// Started implements engine.Inspector: a prepared sandbox is runsc's
// "created"; one that runsc does not know was never started. One runsc
// cannot tell about just now counts as started: it may hold a user's
// state.
func (e *Engine) Started(ctx context.Context, id string) bool {
	st, err := e.state(ctx, id)
	if err != nil {
		return !errdefs.IsNotFound(err)
	}
	return st.Status != "created"
}

// Version is the engine's version for /v1/health: runsc's.
func (e *Engine) Version(ctx context.Context) string { return e.RunscVersion(ctx) }
