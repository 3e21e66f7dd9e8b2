// Package qemu is the clade engine that runs each sandbox in its own QEMU
// microVM (-M microvm): a guest kernel of its own, the image's root as a
// read-only ext4 disk under a tmpfs upper layer, and clade-agent as PID 1
// talking to the host over a virtio-serial port (these hosts have no
// vhost-vsock). It uses KVM when a probe boot under KVM succeeds and TCG
// (software emulation) otherwise.
//
// Guest RAM lives in a file (memory-backend-file share=on in /dev/shm), so
// a checkpoint is the VM's device state (QMP migrate with x-ignore-shared)
// plus a copy of that file, and every sandbox restored from it maps the
// copy privately (share=off): forked children share the pages none of them
// wrote, in the host's page cache.
package qemu

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/nothp"
	"github.com/clade-sandbox/clade/internal/vminit"
	"golang.org/x/sys/unix"
)

var (
	_ engine.Engine      = (*Engine)(nil)
	_ engine.Snapshotter = (*Engine)(nil)
	_ engine.Preparer    = (*Engine)(nil)
	_ engine.Inspector   = (*Engine)(nil)
	_ engine.ForkSharer  = (*Engine)(nil)

	_ engine.HostnameSetter = (*sandbox)(nil)
)

// DefaultTCGCacheMiB is Config.TCGCacheMiB's default (the daemon's
// --qemu-tcg-cache). The cache is private to each QEMU and fills as the
// guest runs new code, so it bounds much of what a fork child holds of its
// own. Measured side by side (16 children of a 512 MiB guest holding 64
// MiB, THP off; docs/benchmarks.md): a child that has run one command
// holds ~36 MiB PSS with 16, ~32 with 12, ~27 with 8; ten varied commands
// took 1.15-1.3x as long with 12 as with 16, and 1.7x with 8 (a cache
// smaller than the guest's working set is flushed and refilled; a
// conformance run with 8 lost a busy child's agent under load). 12 keeps a
// child within 32 MiB at a price in exec time that the flag can buy back.
const DefaultTCGCacheMiB = 12

// DefaultKernelDir is where `make deps-qemu` puts the guest kernel.
const DefaultKernelDir = "/var/cache/clade/qemu"

// Config configures the engine.
type Config struct {
	// StateDir holds per-sandbox files, root disk images and the initramfs.
	StateDir string
	// QEMU is qemu-system-x86_64; looked up in PATH when empty.
	QEMU string
	// KernelDir holds vmlinux and modules/ (scripts/qemu-guest.sh);
	// DefaultKernelDir when empty.
	KernelDir string
	// AgentPath is the clade-agent binary on the host (static).
	AgentPath string
	// Accel is "kvm", "tcg" or "" (probe: KVM if it boots a guest, else TCG).
	Accel string
	// TCGCacheMiB is each VM's TCG translation cache (QEMU's tb-size) when
	// it runs under TCG; DefaultTCGCacheMiB when zero. It is private to each
	// QEMU, so it bounds much of a forked child's own memory.
	TCGCacheMiB int
	// ReadyTimeout bounds how long a boot waits for the agent; 60s if zero.
	ReadyTimeout time.Duration
	Log          *slog.Logger
}

// Engine drives QEMU.
type Engine struct {
	cfg       Config
	sbRoot    string
	imgDir    string
	initramfs string
	// launcher is the engine's copy of the agent that QEMU starts through
	// (nothp), made at setup: replacing or removing the configured binary
	// while the daemon runs (an upgrade, a rebuild) leaves it alone, as it
	// leaves the initramfs' copy.
	launcher string
	vmlinux  string
	// shmPrefix names guest RAM files: PREFIX<id>.mem in /dev/shm.
	shmPrefix string
	accel     string
	accelWhy  string
	tscKHz    int

	// helloWait bounds a restored VM's wait for its agent's first hello
	// before the link redials (see link); defaultHelloWait unless a test
	// sets it.
	helloWait time.Duration
	// noNudge: links write no wire.Nudge (a test compares).
	noNudge bool
	// keepTHP: QEMU starts without the no-THP launcher (a test compares).
	keepTHP bool

	setupOnce sync.Once
	accelOnce sync.Once
	// accelKnown is set once accel and accelWhy are (Version reads them
	// without waiting for a probe).
	accelKnown  atomic.Bool
	versionOnce sync.Once
	version     string
	setupErr    error

	imgMu sync.Mutex
	mu    sync.Mutex
	live  map[string]*sandbox
}

// New checks the configuration, builds the initramfs and picks KVM or TCG.
func New(cfg Config) (*Engine, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.KernelDir == "" {
		cfg.KernelDir = DefaultKernelDir
	}
	if cfg.TCGCacheMiB <= 0 {
		cfg.TCGCacheMiB = DefaultTCGCacheMiB
	}
	if cfg.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, errors.New("qemu-system-x86_64 not found: run `make deps-qemu` (apt-get install qemu-system-x86)")
		}
		cfg.QEMU = p
	} else if st, err := os.Stat(cfg.QEMU); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("qemu binary %s not found or not executable: run `make deps-qemu` (apt-get install qemu-system-x86) or set --qemu", cfg.QEMU)
	}
	vmlinux := filepath.Join(cfg.KernelDir, "vmlinux")
	if _, err := os.Stat(vmlinux); err != nil {
		return nil, fmt.Errorf("guest kernel %s missing: run `make deps-qemu`", vmlinux)
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	sum := sha256.Sum256([]byte(abs))
	e := &Engine{cfg: cfg, sbRoot: filepath.Join(abs, "sandboxes"), imgDir: filepath.Join(abs, "images"),
		initramfs: filepath.Join(abs, "initramfs.cpio"), launcher: filepath.Join(abs, "bin", "clade-agent"), vmlinux: vmlinux,
		shmPrefix: filepath.Join("/dev/shm", "clade-qemu-"+hex.EncodeToString(sum[:6])+"-"),
		live:      map[string]*sandbox{}, tscKHz: hostTSCkHz(), helloWait: defaultHelloWait}
	for _, d := range []string{e.sbRoot, e.imgDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, fmt.Errorf("agent binary: %w: run `make build` or set --agent", err)
	}
	return e, nil
}

// setup builds the initramfs and picks KVM or TCG, once, at the first VM
// start: a daemon that never starts a VM pays nothing for it.
func (e *Engine) setup() error {
	e.setupOnce.Do(func() {
		agent, err := os.ReadFile(e.cfg.AgentPath)
		if err != nil {
			e.setupErr = fmt.Errorf("agent binary: %w: run `make build` or set --agent", err)
			return
		}
		if e.setupErr = buildInitramfs(agent, filepath.Join(e.cfg.KernelDir, "modules"), e.initramfs); e.setupErr == nil {
			e.setupErr = installLauncher(agent, e.launcher)
		}
	})
	e.Accel()
	return e.setupErr
}

// readSnapMeta reads a checkpoint's vm.json.
func readSnapMeta(dir string) (snapMeta, error) {
	var sm snapMeta
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err == nil {
		err = json.Unmarshal(b, &sm)
	}
	return sm, err
}

// IsCheckpoint reports whether dir holds a qemu checkpoint (multi.CheckpointOwner).
func (e *Engine) IsCheckpoint(dir string) bool { return IsCheckpoint(dir) }

// IsCheckpoint tells whether dir holds a qemu checkpoint (its vm.json),
// without an engine: a daemon on a host without QEMU recognises, and
// refuses, the restore of one.
func IsCheckpoint(dir string) bool {
	sm, err := readSnapMeta(dir)
	return err == nil && sm.Format != ""
}

// hostTSCkHz is the host's TSC frequency, for the guest's tsc_early_khz
// (without it a microvm guest under TCG hangs calibrating).
func hostTSCkHz() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(f * 1000)
			}
		}
	}
	return 2000000
}

// pickAccel returns the accelerator and why: KVM only when a guest boots
// under it within a deadline (some hosts' KVM cannot boot stock kernels).
func (e *Engine) pickAccel(want string) (string, string) {
	if want != "" {
		return want, "configured"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", "no usable /dev/kvm (" + err.Error() + ")"
	}
	f.Close()
	// The kernel panics at once for want of an init: QEMU exits (with
	// -no-reboot) when the boot under KVM works.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cfg.QEMU, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-kernel", e.vmlinux,
		"-append", "panic=-1 rdinit=/nonexistent init=/nonexistent")
	if err := cmd.Run(); ctx.Err() != nil {
		return "tcg", "a probe guest did not boot under KVM within 20s"
	} else if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() != 0 {
		return "tcg", "QEMU failed to start a KVM guest: " + err.Error()
	}
	return "kvm", "a probe guest booted under KVM"
}

// defaultHelloWait is how long a restored VM's link waits for the agent's
// first hello before it redials. Under TCG with many children restoring at
// once the hello takes seconds: a shorter wait redials twice per child,
// and each redial is more guest work (the agent sees the host go and come
// back) and a lost hello.
const defaultHelloWait = 5 * time.Second

// Name implements engine.Engine.
func (e *Engine) Name() string { return "qemu" }

// Accel returns "kvm" or "tcg" and why it was picked.
func (e *Engine) Accel() (string, string) {
	e.accelOnce.Do(func() {
		e.accel, e.accelWhy = e.pickAccel(e.cfg.Accel)
		e.accelKnown.Store(true)
		e.cfg.Log.Info("qemu engine", "accel", e.accel, "why", e.accelWhy)
	})
	return e.accel, e.accelWhy
}

// Version is QEMU's version and the accelerator, for /v1/health. It never
// probes: the probe boots a guest (60 ms to over a second here), which a
// daemon that starts no VM, and every health call, need not wait for.
// Until the first VM start has picked the accelerator it says so.
func (e *Engine) Version(ctx context.Context) string {
	e.versionOnce.Do(func() {
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		e.version = "unknown"
		if out, err := exec.CommandContext(vctx, e.cfg.QEMU, "--version").Output(); err == nil {
			v, _, _ := strings.Cut(string(out), "\n")
			e.version = strings.TrimPrefix(v, "QEMU emulator version ")
		}
	})
	if e.cfg.Accel == "" && !e.accelKnown.Load() {
		return fmt.Sprintf("qemu %s, accelerator not picked yet (KVM if a probe guest boots under it, else TCG, at the first VM start)", e.version)
	}
	accel, why := e.Accel()
	return fmt.Sprintf("qemu %s, %s (%s)", e.version, accel, why)
}

// vmMeta is what a sandbox's directory records about it, so that a later
// engine (after a restart) drives it the same way.
type vmMeta struct {
	MemoryMiB int    `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	DiskMiB   int    `json:"disk_mib"`
	RootImage string `json:"root_image"`
	// SharedRAM: guest RAM is the share=on file MemPath (a checkpoint
	// copies it); else RAM is a private mapping of a snapshot's file and a
	// checkpoint writes it into the migration stream.
	SharedRAM bool   `json:"shared_ram"`
	MemPath   string `json:"mem_path"`
	// NetNS is the sandbox's network namespace: QEMU runs in it and gives
	// the guest a NIC on its user-mode network (see vminit.GuestAddr).
	NetNS    string `json:"netns,omitempty"`
	Prepared bool   `json:"prepared,omitempty"`
	Started  bool   `json:"started,omitempty"`
}

type sandbox struct {
	id     string
	dir    string
	pid    int
	meta   vmMeta
	client *guest.Conn
	q      *qmp
	link   *link
	// hostname is the one Restore set (engine.HostnameSetter).
	hostname string

	expectExit atomic.Bool
	exited     chan struct{}
	reason     string
	stopOnce   sync.Once
	stopped    chan struct{}
}

func (s *sandbox) ID() string              { return s.id }
func (s *sandbox) Guest() *guest.Conn      { return s.client }
func (s *sandbox) PID() int                { return s.pid }
func (s *sandbox) Exited() <-chan struct{} { return s.exited }
func (s *sandbox) ExitReason() string      { return s.reason }
func (s *sandbox) HostnameSet() string     { return s.hostname }

// let go of the sandbox's connections (not of the VM).
func (s *sandbox) release(reason error) {
	s.stopOnce.Do(func() {
		close(s.stopped)
		if s.link != nil {
			s.link.close()
		}
		if s.q != nil {
			s.q.Close()
		}
		s.client.Close(reason)
	})
}

func (e *Engine) dir(id string) string { return filepath.Join(e.sbRoot, id) }

// Holds implements multi.Holder: id has a VM directory here.
func (e *Engine) Holds(id string) bool {
	_, err := os.Lstat(e.dir(id))
	return err == nil
}

// memFile is the share=on file holding id's guest RAM.
func (e *Engine) memFile(id string) string { return e.shmPrefix + id + ".mem" }

// MemFiles returns the guest RAM files the engine holds (for leak checks).
func (e *Engine) MemFiles() []string {
	m, _ := filepath.Glob(e.shmPrefix + "*")
	return m
}

func readMeta(dir string) (vmMeta, error) {
	var m vmMeta
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

func writeMeta(dir string, m vmMeta) error {
	b, _ := json.Marshal(m)
	tmp := filepath.Join(dir, "vm.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "vm.json"))
}

func validID(id string) error {
	if len(id) == 0 || len(id) > 64 || strings.ContainsAny(id, "/. \x00") {
		return errdefs.New(errdefs.InvalidArgument, "bad sandbox id %q", id)
	}
	return nil
}

// layout makes (or, for a prepared sandbox, reuses) id's directory, its
// config disk and its metadata.
func (e *Engine) layout(ctx context.Context, spec engine.Spec) (vmMeta, bool, error) {
	if err := validID(spec.ID); err != nil {
		return vmMeta{}, false, err
	}
	if spec.DiskMiB < 0 {
		return vmMeta{}, false, errdefs.New(errdefs.InvalidArgument, "disk cap %d MiB: want 0 (none) or more", spec.DiskMiB)
	}
	dir := e.dir(spec.ID)
	prepared := false
	if err := os.Mkdir(dir, 0o700); err != nil {
		if !os.IsExist(err) {
			return vmMeta{}, false, err
		}
		m, merr := readMeta(dir)
		if merr != nil || !m.Prepared {
			return vmMeta{}, false, errdefs.New(errdefs.AlreadyExists, "sandbox %s already exists", spec.ID)
		}
		prepared = true
	}
	root, err := e.rootImage(ctx, spec.RootFS)
	if err != nil {
		return vmMeta{}, prepared, err
	}
	mem := spec.MemoryMiB
	if mem <= 0 {
		mem = 256
	}
	cpus := int(spec.CPUs + 0.999)
	if cpus < 1 {
		cpus = 1
	}
	m := vmMeta{MemoryMiB: mem, CPUs: cpus, DiskMiB: spec.DiskMiB, RootImage: root, SharedRAM: true,
		MemPath: e.memFile(spec.ID), NetNS: spec.NetNS, Prepared: true}
	cfg, err := vminit.Config{Hostname: spec.Hostname, Env: spec.Env, Workdir: spec.Workdir, User: spec.User,
		DiskMiB: spec.DiskMiB, DNS: spec.DNS, Net: spec.NetNS != ""}.Encode()
	if err != nil {
		return m, prepared, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.img"), cfg, 0o600); err != nil {
		return m, prepared, err
	}
	return m, prepared, writeMeta(dir, m)
}

// Prepare implements engine.Preparer: the sandbox's directory, config disk
// and root image are made ahead; the VM itself starts with Create or
// Restore.
func (e *Engine) Prepare(ctx context.Context, spec engine.Spec) error {
	if _, _, err := e.layout(ctx, spec); err != nil {
		return errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
	}
	return nil
}

// SharesForkMemory implements engine.ForkSharer. Only a "shared"
// checkpoint (of a VM whose RAM is its own share=on file: one that was
// booted, not restored) gives children a private mapping of its memory
// file (share=off), whose unwritten pages stay shared in the page cache.
// A checkpoint of a restored VM (a fork child, a woken sandbox) is a
// "stream": each child loads all of its RAM into a share=on file of its
// own in /dev/shm and shares nothing.
func (e *Engine) SharesForkMemory(_ context.Context, id, dir string) bool {
	if dir != "" {
		sm, err := readSnapMeta(dir)
		return err == nil && sm.Format == "shared"
	}
	e.mu.Lock()
	sb := e.live[id]
	e.mu.Unlock()
	if sb != nil {
		return sb.meta.SharedRAM
	}
	m, err := readMeta(e.dir(id))
	return err == nil && m.SharedRAM
}

// Started implements engine.Inspector.
func (e *Engine) Started(ctx context.Context, id string) bool {
	m, err := readMeta(e.dir(id))
	return err == nil && m.Started
}

// args is the QEMU command line for a sandbox; incoming starts it waiting
// for a migration stream instead of booting.
func (e *Engine) args(id string, m vmMeta, memPath string, share bool, incoming bool) []string {
	dir := e.dir(id)
	_ = e.setup() // its error is launch's
	accel := e.accel
	cpu := "max"
	if accel == "kvm" {
		cpu = "host"
	}
	accelOpt := accel
	if accel == "tcg" {
		// TCG's translation cache is private to each QEMU: a small one
		// keeps a forked child's own memory small.
		accelOpt = fmt.Sprintf("tcg,tb-size=%d", e.cfg.TCGCacheMiB)
	}
	shareOpt := "off"
	if share {
		shareOpt = "on"
	}
	a := []string{
		"-name", "clade-" + id,
		"-M", "microvm,x-option-roms=off,rtc=on,memory-backend=mem",
		"-accel", accelOpt, "-cpu", cpu, "-smp", strconv.Itoa(m.CPUs), "-m", strconv.Itoa(m.MemoryMiB) + "M",
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", m.MemoryMiB, memPath, shareOpt),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "file,id=con,path=" + filepath.Join(dir, "console.log"), "-serial", "chardev:con",
		"-drive", "id=root,if=none,format=raw,readonly=on,file=" + m.RootImage,
		"-device", "virtio-blk-device,drive=root",
		"-drive", "id=cfg,if=none,format=raw,readonly=on,file=" + filepath.Join(dir, "config.img"),
		"-device", "virtio-blk-device,drive=cfg",
		"-device", "virtio-rng-device",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,server=on,wait=off,path=" + filepath.Join(dir, "agent.sock"),
		"-device", "virtserialport,chardev=agent,id=agentport,name=" + vminit.PortName,
		"-qmp", "unix:" + filepath.Join(dir, "qmp.sock") + ",server=on,wait=off",
		"-pidfile", filepath.Join(dir, "pid"),
		"-daemonize",
	}
	if m.NetNS != "" {
		// User-mode networking: the guest's traffic leaves from QEMU's
		// sockets in the sandbox's namespace, under its address and policy.
		a = append(a, "-netdev", "user,id=net0", "-device", "virtio-net-device,netdev=net0")
	}
	if incoming {
		// A restored guest's kernel is in its RAM already: QEMU need not
		// read the 50 MB vmlinux and the initramfs for every child.
		a = append(a, "-incoming", "defer")
	} else {
		a = append(a, "-kernel", e.vmlinux, "-initrd", e.initramfs,
			"-append", fmt.Sprintf("console=ttyS0 quiet tsc_early_khz=%d cryptomgr.notests panic=-1 rdinit=%s/clade-agent",
				e.tscKHz, vminit.AgentDir))
	}
	return a
}

// launch starts QEMU for id; it returns once QEMU runs in the background.
func (e *Engine) launch(ctx context.Context, id string, args []string) error {
	dir := e.dir(id)
	if err := e.setup(); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	argv := append([]string{e.cfg.QEMU}, args...)
	if m, err := readMeta(dir); err == nil && m.NetNS != "" {
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			return fmt.Errorf("a networked VM starts in its namespace through nsenter: %w (apt-get install util-linux)", err)
		}
		argv = append([]string{nsenter, "--net=" + m.NetNS, "--"}, argv...)
	}
	// Through the agent binary, which turns THP off for QEMU (see nothp).
	cmd := nothp.Command(ctx, e.launcher, argv)
	if e.keepTHP {
		cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("qemu: %w: %s", err, tail(logf.Name(), start))
	}
	return nil
}

// tail returns what a log gained after offset, shortened to its end.
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

// connect attaches to id's running QEMU: QMP, the agent link, the exit
// watch. firstWait bounds the wait for the agent's first hello; auth says
// which agent keys it takes (its Save is set here).
func (e *Engine) connect(ctx context.Context, id string, m vmMeta, firstWait time.Duration, auth guest.Auth) (*sandbox, error) {
	dir := e.dir(id)
	pid := readPID(dir)
	if pid == 0 {
		return nil, fmt.Errorf("qemu for %s has no pid file", id)
	}
	sb := &sandbox{id: id, dir: dir, pid: pid, meta: m, client: guest.NewConn(), exited: make(chan struct{}), stopped: make(chan struct{})}
	auth.Save = guest.KeySaver(filepath.Join(dir, guest.KeyFile))
	sb.client.Authenticate(auth)
	sb.link = newLink(filepath.Join(dir, "agent.sock"), sb.client, firstWait)
	sb.link.noNudge = e.noNudge
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := dialQMP(qctx, filepath.Join(dir, "qmp.sock"), nil)
	if err != nil {
		return nil, err
	}
	sb.q = q
	return sb, nil
}

// cpuTime is the CPU time process pid has used (for the debug log).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ is 100
}

func readPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// alive reports whether pid is id's QEMU.
func (e *Engine) alive(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), e.dir(id)+"/")
}

// watch closes s.exited when QEMU ends without Destroy.
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
				close(s.exited)
				return
			default:
			}
			if err == unix.EINTR || n == 0 {
				continue
			}
			break
		}
		if !s.expectExit.Load() {
			s.reason = "the VM stopped unexpectedly"
			if b, err := os.ReadFile(filepath.Join(s.dir, "console.log")); err == nil {
				if i := strings.LastIndex(string(b), "Kernel panic"); i >= 0 {
					line, _, _ := strings.Cut(string(b[i:]), "\n")
					s.reason += ": " + strings.TrimSpace(line)
				}
			}
		}
		s.release(errdefs.New(errdefs.Unavailable, "sandbox %s stopped", s.id))
		close(s.exited)
	}()
}

// Create implements engine.Engine.
func (e *Engine) Create(ctx context.Context, spec engine.Spec) (_ engine.Sandbox, err error) {
	m, _, err := e.layout(ctx, spec)
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil, err
		}
		return nil, errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
		}
	}()
	m.Prepared, m.Started = false, true
	if err := writeMeta(e.dir(spec.ID), m); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := e.launch(ctx, spec.ID, e.args(spec.ID, m, m.MemPath, true, false)); err != nil {
		return nil, err
	}
	sb, err := e.connect(ctx, spec.ID, m, e.cfg.ReadyTimeout, guest.Auth{Fresh: true})
	if err != nil {
		return nil, err
	}
	return e.finish(ctx, sb, t0)
}

// finish starts the agent link, waits for the agent and registers sb.
func (e *Engine) finish(ctx context.Context, sb *sandbox, t0 time.Time) (engine.Sandbox, error) {
	e.watch(sb)
	go sb.link.run()
	e.mu.Lock()
	e.live[sb.id] = sb
	e.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ReadyTimeout)
	defer cancel()
	if err := sb.client.Ready(rctx); err != nil {
		return nil, fmt.Errorf("agent of %s did not connect: %w (console: %s)", sb.id, err, tail(filepath.Join(sb.dir, "console.log"), 0))
	}
	e.cfg.Log.Debug("sandbox started", "sandbox", sb.id, "took", time.Since(t0))
	return sb, nil
}

// Attach implements engine.Engine.
func (e *Engine) Attach(ctx context.Context, spec engine.Spec) (engine.Sandbox, error) {
	e.mu.Lock()
	sb := e.live[spec.ID]
	e.mu.Unlock()
	if sb != nil {
		return sb, nil
	}
	dir := e.dir(spec.ID)
	m, err := readMeta(dir)
	if err != nil || !m.Started || !e.alive(readPID(dir), spec.ID) {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s is not running", spec.ID)
	}
	// The VM runs: failing to reach its agent now (a loaded host, a
	// stopped QEMU, ctx ended) is no sign it is gone, and the caller must
	// not destroy it for that.
	keys, legacy, err := guest.LoadKeys(filepath.Join(dir, guest.KeyFile))
	if err != nil {
		return nil, unreachable(fmt.Errorf("sandbox %s runs, but its agent cannot be told from an impostor: %w", spec.ID, err))
	}
	if legacy {
		e.cfg.Log.Warn("VM started by an older clade: its agent cannot prove itself, so a process in it could pose as it; recreate it to close that", "sandbox", spec.ID)
	}
	sb, err = e.connect(ctx, spec.ID, m, 2*time.Second, guest.Auth{Keys: keys, Legacy: legacy})
	if err != nil {
		return nil, unreachable(err)
	}
	s, err := e.finish(ctx, sb, time.Now())
	if err != nil {
		e.forget(sb)
		return nil, unreachable(err)
	}
	return s, nil
}

// unreachable classes an error reaching a running VM as Unavailable,
// unless it already has a class.
func unreachable(err error) error {
	if errdefs.ClassOf(err) != errdefs.Internal {
		return err
	}
	return errdefs.Wrap(errdefs.Unavailable, err)
}

func (e *Engine) forget(sb *sandbox) {
	e.mu.Lock()
	if e.live[sb.id] == sb {
		delete(e.live, sb.id)
	}
	e.mu.Unlock()
	sb.release(nil)
}

// Destroy implements engine.Engine.
func (e *Engine) Destroy(ctx context.Context, id string) error {
	if validID(id) != nil {
		return nil
	}
	e.mu.Lock()
	sb := e.live[id]
	delete(e.live, id)
	e.mu.Unlock()
	if sb != nil {
		sb.expectExit.Store(true)
		sb.release(errdefs.New(errdefs.NotFound, "sandbox %s was destroyed", id))
	}
	dir := e.dir(id)
	if err := e.kill(ctx, id); err != nil {
		return err
	}
	_ = os.Remove(e.memFile(id))
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if sb != nil {
		<-sb.exited
	}
	return nil
}

// kill ends every QEMU of sandbox id and waits until they are gone.
func (e *Engine) kill(ctx context.Context, id string) error {
	mark := e.dir(id) + "/"
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []int
		ents, _ := os.ReadDir("/proc")
		for _, d := range ents {
			pid, err := strconv.Atoi(d.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !strings.Contains(string(b), mark) {
				continue
			}
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] == "Z" {
					continue
				}
			}
			_ = unix.Kill(pid, unix.SIGKILL)
			left = append(left, pid)
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu processes %v of sandbox %s outlived SIGKILL", left, id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// List implements engine.Engine.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(e.sbRoot)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, d := range ents {
		if d.IsDir() {
			ids = append(ids, d.Name())
		}
	}
	return ids, nil
}

// Close implements engine.Engine: the VMs run on.
func (e *Engine) Close() error {
	e.mu.Lock()
	live := e.live
	e.live = map[string]*sandbox{}
	e.mu.Unlock()
	for _, sb := range live {
		sb.release(nil)
	}
	return nil
}

// snapMeta describes a checkpoint directory.
type snapMeta struct {
	vmMeta
	// Format is "shared" (RAM in the file mem, device state in state) or
	// "stream" (RAM in the migration stream too).
	Format string `json:"format"`
}

// Checkpoint implements engine.Snapshotter.
func (e *Engine) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) (err error) {
	e.mu.Lock()
	sb := e.live[id]
	e.mu.Unlock()
	if sb == nil {
		return errdefs.New(errdefs.Conflict, "sandbox %s is not running", id)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return classifyDiskErr(err, dir)
	}
	t0 := time.Now()
	// The agent must not be connected while the state is saved: stop
	// dialling, ask it to hang up (the link drops the socket when its
	// session ends); its next hello waits in the guest for whichever host
	// connects next, this one or a restored copy's.
	sb.link.pause()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = sb.client.Quiesce(qctx)
	cancel()
	sb.link.dropCurrent()
	if err != nil {
		sb.link.unpause()
		return err
	}
	t1 := time.Now()
	resume := func() error {
		_, err := sb.q.exec(context.WithoutCancel(ctx), "cont", nil)
		sb.link.unpause()
		return err
	}
	if _, err := sb.q.exec(ctx, "stop", nil); err != nil {
		sb.link.unpause()
		return err
	}
	err = e.save(ctx, sb, dir)
	t2 := time.Now()
	if err != nil {
		for _, f := range []string{"state", "state.tmp", "mem", "mem.tmp", "vm.json", guest.KeyFile} {
			_ = os.Remove(filepath.Join(dir, f))
		}
		return errors.Join(classifyDiskErr(err, dir), resume())
	}
	if !leaveRunning {
		// The caller marks the image whole while the VM can still go on.
		if serr := engine.Seal(ctx); serr != nil {
			return errors.Join(serr, resume())
		}
	}
	if leaveRunning {
		err = resume()
	} else {
		sb.expectExit.Store(true)
		_, qerr := sb.q.exec(ctx, "quit", nil)
		if qerr != nil {
			_ = unix.Kill(sb.pid, unix.SIGKILL)
		}
	}
	e.cfg.Log.Debug("checkpoint", "sandbox", id, "quiesce", t1.Sub(t0), "save", t2.Sub(t1), "total", time.Since(t0))
	return err
}

// save writes the stopped VM's state into dir.
func (e *Engine) save(ctx context.Context, sb *sandbox, dir string) error {
	sm := snapMeta{vmMeta: sb.meta, Format: "stream"}
	if sb.meta.SharedRAM {
		sm.Format = "shared"
	}
	if _, err := sb.q.exec(ctx, "migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{
		{"capability": "x-ignore-shared", "state": sm.Format == "shared"}}}); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.tmp")
	if _, err := sb.q.exec(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(tmp)}); err != nil {
		return err
	}
	if err := sb.q.waitMigration(ctx); err != nil {
		return err
	}
	if sm.Format == "shared" {
		if err := copySparse(sb.meta.MemPath, filepath.Join(dir, "mem.tmp")); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(dir, "mem.tmp"), filepath.Join(dir, "mem")); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, filepath.Join(dir, "state")); err != nil {
		return err
	}
	// The restored agents present this key (see guest.Auth).
	if err := guest.WriteKeys(filepath.Join(dir, guest.KeyFile), sb.client.Keys()); err != nil {
		return err
	}
	b, _ := json.Marshal(sm)
	return os.WriteFile(filepath.Join(dir, "vm.json"), b, 0o600)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// copySparse copies src to dst, skipping holes and all-zero blocks (a
// guest's untouched RAM).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	zero := make([]byte, 4096)
	var off int64
	for off < fi.Size() {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: only a hole is left
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			hole = fi.Size()
		}
		for p := data; p < hole; {
			n := min(int64(len(buf)), hole-p)
			k, err := in.ReadAt(buf[:n], p)
			if err != nil && k == 0 {
				return err
			}
			for i := 0; i < k; i += 4096 {
				j := min(i+4096, k)
				if string(buf[i:j]) == string(zero[:j-i]) {
					continue
				}
				if _, err := out.WriteAt(buf[i:j], p+int64(i)); err != nil {
					return err
				}
			}
			p += int64(k)
		}
		off = hole
	}
	return out.Close()
}

// classifyDiskErr makes a checkpoint that ran out of disk a
// ResourceExhausted error that says so.
func classifyDiskErr(err error, dir string) error {
	if err == nil {
		return nil
	}
	var st unix.Statfs_t
	full := errors.Is(err, unix.ENOSPC) || strings.Contains(strings.ToLower(err.Error()), "no space left")
	if !full && unix.Statfs(dir, &st) == nil && st.Bavail*uint64(st.Bsize) < 64<<20 {
		full = true
	}
	if !full {
		return err
	}
	return errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("the disk holding %s is full: the checkpoint did not fit; free some space (remove snapshots or sleeping sandboxes) and retry; the sandbox is still running: %w", dir, err))
}

// Restore implements engine.Snapshotter.
func (e *Engine) Restore(ctx context.Context, spec engine.Spec, dir string) (_ engine.Sandbox, err error) {
	sm, err := readSnapMeta(dir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%s is not a qemu checkpoint: %w", dir, err))
	}
	spec.MemoryMiB = sm.MemoryMiB
	spec.CPUs = float64(sm.CPUs)
	m, _, err := e.layout(ctx, spec)
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil, err
		}
		return nil, errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Destroy(context.WithoutCancel(ctx), spec.ID))
		}
	}()
	// The guest's disk layout must match the checkpoint's: its root image
	// and disk cap are the checkpointed ones.
	m.RootImage, m.DiskMiB = sm.RootImage, sm.DiskMiB
	if (sm.NetNS != "") != (spec.NetNS != "") {
		return nil, errdefs.New(errdefs.InvalidArgument, "the checkpoint in %s was taken with a network card %v and the new sandbox asks for one %v: a VM's devices must match its checkpoint's; restore it with the same network mode", dir, sm.NetNS != "", spec.NetNS != "")
	}
	memPath, share := m.MemPath, true
	if sm.Format == "shared" {
		memPath, share = filepath.Join(dir, "mem"), false
		m.SharedRAM = false
	}
	m.Prepared, m.Started = false, true
	if err := writeMeta(e.dir(spec.ID), m); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := e.launch(ctx, spec.ID, e.args(spec.ID, m, memPath, share, true)); err != nil {
		return nil, err
	}
	tLaunch := time.Now()
	keys, legacy, err := guest.LoadKeys(filepath.Join(dir, guest.KeyFile))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if legacy {
		e.cfg.Log.Warn("restoring a checkpoint older than agent keys: its agent cannot prove itself, so a process in the VM could pose as it; take the snapshot again to close that", "sandbox", spec.ID, "checkpoint", dir)
	}
	sb, err := e.connect(ctx, spec.ID, m, e.helloWait, guest.Auth{Keys: keys, Restored: true, Legacy: legacy})
	if err != nil {
		return nil, err
	}
	tQMP := time.Now()
	if _, err := sb.q.exec(ctx, "migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{
		{"capability": "x-ignore-shared", "state": sm.Format == "shared"}}}); err != nil {
		sb.release(nil)
		return nil, err
	}
	if _, err := sb.q.exec(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(filepath.Join(dir, "state"))}); err != nil {
		sb.release(nil)
		return nil, err
	}
	if err := sb.q.waitMigration(ctx); err != nil {
		sb.release(nil)
		return nil, err
	}
	tIn := time.Now()
	cpuIn := cpuTime(sb.pid)
	if _, err := sb.q.exec(ctx, "cont", nil); err != nil {
		sb.release(nil)
		return nil, err
	}
	s, err := e.finish(ctx, sb, t0)
	if err != nil {
		return nil, err
	}
	cpuReady := cpuTime(sb.pid)
	tReady := time.Now()
	// A copy of a VM has its parent's clock, entropy pool and hostname:
	// step the one, reseed the other and set the spec's, in one frame.
	seed := make([]byte, 64)
	_, _ = rand.Read(seed)
	if err := sb.client.Reconfigure(ctx, guest.Config{Clock: time.Now(), Seed: seed, Hostname: spec.Hostname}); err != nil {
		return nil, fmt.Errorf("reseed, set the clock and the hostname of %s: %w", spec.ID, err)
	}
	sb.hostname = spec.Hostname
	e.cfg.Log.Debug("restore", "sandbox", spec.ID, "launch", tLaunch.Sub(t0), "qmp", tQMP.Sub(tLaunch),
		"incoming", tIn.Sub(tQMP), "agent", tReady.Sub(tIn), "silent", sb.link.silent.Load(), "reseed", time.Since(tReady), "total", time.Since(t0),
		"qemu_cpu_before_cont", cpuIn, "qemu_cpu_ready", cpuReady, "qemu_cpu", cpuTime(sb.pid))
	return s, nil
}
