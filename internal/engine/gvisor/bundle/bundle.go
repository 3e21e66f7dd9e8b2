// Package bundle writes the OCI bundle (config.json) of a clade sandbox
// under runsc. The gvisor engine and the bench's plain-runsc baseline both
// write their bundles here, so the baseline cannot drift from what it is
// compared with.
package bundle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// BaseEnv is the environment every sandbox process starts with, before the
// image's and the caller's.
var BaseEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}

// caps are the capabilities of a container's init (Docker's default set).
var caps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// Mount is a bind mount of a host directory into the sandbox, or with
// Tmpfs a small tmpfs (1 MiB, mode 0700; Source unused).
type Mount struct {
	Source, Destination string
	ReadOnly            bool
	Tmpfs               bool
}

// Spec is what differs between sandboxes.
type Spec struct {
	// Args is init's argv.
	Args []string
	// Env is appended to BaseEnv and HOSTNAME.
	Env      []string
	Hostname string
	// RootFS is the image's root directory (the overlay's read-only lower).
	RootFS string
	// Cgroup is the cgroup path, e.g. /clade/<id>.
	Cgroup    string
	MemoryMiB int
	CPUs      float64
	// ExtraCaps are granted to init besides Docker's default set.
	ExtraCaps []string
	// Mounts are bind mounts besides /proc, /dev and /sys.
	Mounts []Mount
	// NetNS is the path of a network namespace to join; empty means a new
	// one.
	NetNS string
}

// Write writes s as dir/config.json.
func Write(dir string, s Spec) error {
	b, err := Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// Marshal returns s as an OCI runtime spec.
func Marshal(s Spec) ([]byte, error) {
	if s.RootFS == "" || len(s.Args) == 0 {
		return nil, fmt.Errorf("bundle: rootfs and args are required")
	}
	env := append(append([]string{}, BaseEnv...), "HOSTNAME="+s.Hostname)
	env = append(env, s.Env...)
	allCaps := append(append([]string{}, caps...), s.ExtraCaps...)
	resources := map[string]any{"pids": map[string]any{"limit": 32768}}
	if s.MemoryMiB > 0 {
		resources["memory"] = map[string]any{"limit": int64(s.MemoryMiB) << 20}
	}
	if s.CPUs > 0 {
		const period = 100000
		resources["cpu"] = map[string]any{"quota": int64(s.CPUs * period), "period": period}
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, m := range s.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		if m.Tmpfs {
			mounts = append(mounts, map[string]any{"destination": m.Destination, "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "noexec", "mode=0700", "size=1m", mode}})
			continue
		}
		mounts = append(mounts, map[string]any{"destination": m.Destination, "type": "bind", "source": m.Source, "options": []string{"rbind", mode}})
	}
	netns := map[string]any{"type": "network"}
	if s.NetNS != "" {
		netns["path"] = s.NetNS
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": s.Args,
			"env":  env,
			"cwd":  "/",
			"user": map[string]any{"uid": 0, "gid": 0},
			"capabilities": map[string]any{
				"bounding": allCaps, "effective": allCaps, "permitted": allCaps,
			},
			"rlimits": []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}},
		},
		"root":     map[string]any{"path": s.RootFS, "readonly": false},
		"hostname": s.Hostname,
		"mounts":   mounts,
		"linux": map[string]any{
			"cgroupsPath": s.Cgroup,
			"resources":   resources,
			"namespaces": []map[string]any{
				{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, netns,
			},
		},
	}
	return json.MarshalIndent(spec, "", "  ")
}
