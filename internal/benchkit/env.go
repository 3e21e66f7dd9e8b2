package benchkit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/sdk"
)

// Env describes where a result was measured: numbers from different
// machines, filesystems or runsc builds are not comparable without it.
type Env struct {
	Hostname    string `json:"hostname"`
	CPUModel    string `json:"cpu_model"`
	CPUs        int    `json:"cpus"`
	Kernel      string `json:"kernel"`
	MemTotalMiB int64  `json:"mem_total_mib"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute figures at the start:
	// a busy host explains odd numbers.
	LoadAvg string `json:"load_avg"`
	// Daemon side, from its health endpoint.
	DaemonVersion string `json:"daemon_version"`
	Engine        string `json:"engine"`
	Runsc         string `json:"runsc"`
	// The harness itself.
	CladeVersion string `json:"clade_version"`
	CladeCommit  string `json:"clade_commit,omitempty"`
	GoVersion    string `json:"go_version"`
	// DataDir is the daemon's data dir as given to the harness; snapshots
	// live there, so its filesystem and reflink support shape the figures.
	DataDir     string `json:"data_dir"`
	DataDirFS   string `json:"data_dir_fs"`
	Reflink     bool   `json:"reflink"`
	ReflinkNote string `json:"reflink_note,omitempty"`
	// The runsc the baseline drove, when --baseline was given.
	BaselineRunsc        string   `json:"baseline_runsc,omitempty"`
	BaselineRunscVersion string   `json:"baseline_runsc_version,omitempty"`
	CommandLine          []string `json:"command_line"`
}

// collectEnv fills Env from the host, the daemon and cfg.
func collectEnv(ctx context.Context, c *sdk.Client, cfg Config) (Env, error) {
	h, err := c.Health(ctx)
	if err != nil {
		return Env{}, err
	}
	e := Env{
		CPUs:          runtime.NumCPU(),
		DaemonVersion: h.Version,
		Engine:        h.Engine,
		Runsc:         h.EngineVersion,
		CladeVersion:  cfg.CladeVersion,
		CladeCommit:   buildCommit(),
		GoVersion:     runtime.Version(),
		DataDir:       cfg.DataDir,
		CommandLine:   cfg.CommandLine,
	}
	e.Hostname, _ = os.Hostname()
	e.CPUModel = cpuModel()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		e.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	if m, err := meminfo(); err == nil {
		e.MemTotalMiB = m["MemTotal"] >> 10
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			e.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	e.DataDirFS, e.Reflink, e.ReflinkNote = probeFS(cfg.DataDir)
	if cfg.Baseline {
		e.BaselineRunsc = cfg.Runsc
		e.BaselineRunscVersion = runscVersion(ctx, cfg.Runsc)
	}
	return e, nil
}

func buildCommit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func runscVersion(ctx context.Context, runsc string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--version")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return "unknown: " + err.Error()
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}

// fsNames maps statfs magic numbers of the filesystems a data dir is
// likely to sit on.
var fsNames = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
	unix.NFS_SUPER_MAGIC:       "nfs",
	unix.F2FS_SUPER_MAGIC:      "f2fs",
	unix.FUSE_SUPER_MAGIC:      "fuse",
	0x2fc12fc1:                 "zfs",
	0xca451a4e:                 "bcachefs",
}

// probeFS names dir's filesystem and tries a reflink (FICLONE) of a small
// file there. A dir that does not exist yet is probed at its nearest
// existing parent, which is where it would be created.
func probeFS(dir string) (fs string, reflink bool, note string) {
	at := dir
	for {
		if _, err := os.Stat(at); err == nil || at == "/" || at == "." {
			break
		}
		at = filepath.Dir(at)
	}
	if at != dir {
		note = fmt.Sprintf("%s does not exist; probed %s. ", dir, at)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return "unknown", false, note + err.Error()
	}
	fs = fsNames[int64(st.Type)]
	if fs == "" {
		fs = fmt.Sprintf("0x%x", st.Type)
	}
	ok, err := tryReflink(at)
	if err != nil {
		note += "FICLONE: " + err.Error()
	}
	return fs, ok, strings.TrimSpace(note)
}

func tryReflink(dir string) (bool, error) {
	src, err := os.CreateTemp(dir, ".clade-bench-reflink-")
	if err != nil {
		return false, err
	}
	defer os.Remove(src.Name())
	defer src.Close()
	// A whole block of data: some filesystems clone an empty file
	// trivially without supporting reflinks.
	if _, err := src.Write(bytes.Repeat([]byte{'c'}, 4096)); err != nil {
		return false, err
	}
	if err := src.Sync(); err != nil {
		return false, err
	}
	dst, err := os.CreateTemp(dir, ".clade-bench-reflink-")
	if err != nil {
		return false, err
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			return false, nil // a clear "no"
		}
		return false, err
	}
	return true, nil
}
