// Package vminit is the first stage of a clade guest VM (the qemu engine).
// The guest kernel starts clade-agent from the engine's initramfs as PID 1;
// the agent calls Main, which loads the virtio modules, reads the sandbox's
// configuration from its config disk, mounts the image's root (a read-only
// ext4 disk) under a tmpfs upper layer sized by the disk cap, switches root
// into it and execs the agent from there, still PID 1.
package vminit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Marker is a file only the engine's initramfs has: its presence tells the
// agent it is the first stage of a VM.
const Marker = "/clade-vm"

// ConfigMagic starts the config disk; the JSON Config follows it, then NULs.
const ConfigMagic = "CLADECFG\n"

// PortName is the virtio-serial port the agent talks to the host over.
const PortName = "clade.agent"

// AgentDir holds the agent inside the initramfs; it is bind-mounted
// read-only at /.clade/bin in the sandbox's root.
const AgentDir = "/clade"

// Modules are loaded in this order from /modules in the initramfs.
var Modules = []string{"virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "virtio_console", "overlay", "virtio-rng",
	"failover", "net_failover", "virtio_net"}

// The guest's network, when it has one: QEMU's user-mode network (slirp)
// run inside the sandbox's network namespace, so every VM has the same
// address inside and its own outside, and a fork child needs no
// renumbering.
const (
	GuestAddr    = "10.0.2.15/24"
	GuestGateway = "10.0.2.2"
)

// Config is a sandbox's setup, written by the engine on the config disk.
type Config struct {
	Hostname string   `json:"hostname"`
	Env      []string `json:"env,omitempty"`
	Workdir  string   `json:"workdir,omitempty"`
	User     string   `json:"user,omitempty"`
	DiskMiB  int      `json:"disk_mib,omitempty"`
	DNS      []string `json:"dns,omitempty"`
	// Net gives the guest its network card (eth0), configured with
	// GuestAddr and a default route via GuestGateway.
	Net bool `json:"net,omitempty"`
}

// Encode returns the config disk's content: the magic, the JSON, padded to
// a whole number of 512-byte sectors.
func (c Config) Encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	out := append([]byte(ConfigMagic), b...)
	out = append(out, 0)
	if r := len(out) % 512; r != 0 {
		out = append(out, make([]byte, 512-r)...)
	}
	return out, nil
}

// IsVM reports whether this process is PID 1 of a clade VM's initramfs.
func IsVM() bool {
	if os.Getpid() != 1 {
		return false
	}
	_, err := os.Stat(Marker)
	return err == nil
}

// Main runs the first stage and execs the agent; it returns only on
// failure, after which the caller should power the VM off.
func Main(socketEnv string) error {
	if err := setup(socketEnv); err != nil {
		fmt.Fprintf(os.Stderr, "clade vminit: %v\n", err)
		return err
	}
	return nil
}

func setup(socketEnv string) error {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	for _, m := range Modules {
		if err := loadModule(filepath.Join("/modules", m+".ko")); err != nil {
			return err
		}
	}
	cfg, root, err := findDisks(10 * time.Second)
	if err != nil {
		return err
	}
	port, err := findPort(10 * time.Second)
	if err != nil {
		return err
	}
	for _, d := range []string{"/mnt/lower", "/mnt/rw", "/mnt/root"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(root, "/mnt/lower", "ext4", unix.MS_RDONLY, "noload"); err != nil {
		return fmt.Errorf("mount the image's disk %s: %w", root, err)
	}
	opts := "mode=0755"
	if cfg.DiskMiB > 0 {
		opts += fmt.Sprintf(",size=%dm", cfg.DiskMiB)
	}
	if err := unix.Mount("upper", "/mnt/rw", "tmpfs", 0, opts); err != nil {
		return fmt.Errorf("mount the upper layer: %w", err)
	}
	for _, d := range []string{"/mnt/rw/upper", "/mnt/rw/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", "/mnt/root", "overlay", 0,
		"lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work"); err != nil {
		return fmt.Errorf("mount the root overlay: %w", err)
	}
	nr := "/mnt/root"
	if err := os.MkdirAll(nr+"/.clade/bin", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(AgentDir, nr+"/.clade/bin", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the agent: %w", err)
	}
	_ = unix.Mount("", nr+"/.clade/bin", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	for _, d := range []string{"dev", "proc", "sys", "tmp"} {
		_ = os.MkdirAll(filepath.Join(nr, d), 0o755)
	}
	if err := unix.Mount("/dev", nr+"/dev", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /dev: %w", err)
	}
	_ = unix.Mount("/proc", nr+"/proc", "", unix.MS_MOVE, "")
	_ = unix.Mount("/sys", nr+"/sys", "", unix.MS_MOVE, "")
	_ = os.MkdirAll(nr+"/dev/pts", 0o755)
	_ = unix.Mount("devpts", nr+"/dev/pts", "devpts", 0, "ptmxmode=0666,mode=0620")
	_ = os.MkdirAll(nr+"/dev/shm", 0o1777)
	_ = unix.Mount("shm", nr+"/dev/shm", "tmpfs", 0, "mode=1777")
	if len(cfg.DNS) > 0 {
		var b strings.Builder
		for _, ns := range cfg.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", ns)
		}
		_ = os.MkdirAll(nr+"/etc", 0o755)
		_ = os.Remove(nr + "/etc/resolv.conf")
		_ = os.WriteFile(nr+"/etc/resolv.conf", []byte(b.String()), 0o644)
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if cfg.Net {
		if err := ethUp(10 * time.Second); err != nil {
			return err
		}
	}
	if err := os.Chdir(nr); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	env = append(env, cfg.Env...)
	env = append(env, socketEnv+"="+port, "CLADE_AGENT_WORKDIR="+cfg.Workdir, "CLADE_AGENT_USER="+cfg.User)
	return syscall.Exec("/.clade/bin/clade-agent", []string{"clade-agent"}, env)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil // built in, or not needed
		}
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load %s: %w", filepath.Base(path), err)
	}
	return nil
}

// findDisks waits for the two virtio disks and tells them apart by content:
// the config disk starts with ConfigMagic, the root disk is ext4.
func findDisks(timeout time.Duration) (Config, string, error) {
	deadline := time.Now().Add(timeout)
	for {
		var cfg Config
		var haveCfg bool
		root := ""
		names, _ := filepath.Glob("/sys/class/block/vd*")
		for _, n := range names {
			dev := "/dev/" + filepath.Base(n)
			b := make([]byte, 4096)
			f, err := os.Open(dev)
			if err != nil {
				continue
			}
			k, _ := f.ReadAt(b, 0)
			if bytes.HasPrefix(b[:k], []byte(ConfigMagic)) {
				rest, err := readAll(f)
				f.Close()
				if err != nil {
					return cfg, "", err
				}
				js, _, _ := bytes.Cut(rest[len(ConfigMagic):], []byte{0})
				if err := json.Unmarshal(js, &cfg); err != nil {
					return cfg, "", fmt.Errorf("config disk: %w", err)
				}
				haveCfg = true
				continue
			}
			f.Close()
			if k >= 1082 && b[1080] == 0x53 && b[1081] == 0xef {
				root = dev
			}
		}
		if haveCfg && root != "" {
			return cfg, root, nil
		}
		if time.Now().After(deadline) {
			return cfg, "", fmt.Errorf("disks not found (config %v, root %q) among %v", haveCfg, root, names)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readAll(f *os.File) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(f)
	return buf.Bytes(), err
}

// findPort waits for the virtio-serial port named PortName (no udev here to
// make /dev/virtio-ports links) and returns its device path.
func findPort(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err == nil && strings.TrimSpace(string(b)) == PortName {
				dev := filepath.Base(filepath.Dir(n))
				devb, err := os.ReadFile(filepath.Join(filepath.Dir(n), "dev"))
				if err != nil {
					return "", err
				}
				p := "/dev/" + dev
				if _, err := os.Stat(p); err != nil {
					maj, min, _ := strings.Cut(strings.TrimSpace(string(devb)), ":")
					ma, _ := strconv.Atoi(maj)
					mi, _ := strconv.Atoi(min)
					if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(uint32(ma), uint32(mi)))); err != nil {
						return "", err
					}
				}
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %s not found", PortName)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loopbackUp brings lo up: a VM's kernel starts with it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// ethUp configures eth0 with GuestAddr and a default route via
// GuestGateway.
func ethUp(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var link netlink.Link
	for {
		var err error
		if link, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("eth0 not found: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	addr, err := netlink.ParseAddr(GuestAddr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	gw := net.ParseIP(GuestGateway)
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}
