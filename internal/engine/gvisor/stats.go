package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

var _ engine.Statser = (*Engine)(nil)

// Stats implements engine.Statser. CPU time and memory come from the
// cgroup runsc puts the sandbox in (the bundle's cgroupsPath, /clade/ID:
// /sys/fs/cgroup/{cpuacct,memory}/clade/ID on cgroup v1,
// /sys/fs/cgroup/clade/ID on v2); it holds the sentry and the gofer, so it
// counts everything the sandbox costs the host. The process count is the
// sentry's own (`runsc ps`): gVisor's processes are not host processes, and
// the host's pids controller counts the sentry's threads.
func (e *Engine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	e.mu.Lock()
	_, live := e.live[id]
	e.mu.Unlock()
	if !live {
		return engine.Stats{}, errdefs.New(errdefs.NotFound, "sandbox %s is not running", id)
	}
	cg := cgroupsOnce()
	var st engine.Stats
	var err error
	if cg.v2 != "" {
		st, err = readCgroupV2(filepath.Join(cg.v2, "clade", id))
	} else {
		st, err = readCgroupV1(filepath.Join(cg.cpuacct, "clade", id), filepath.Join(cg.memory, "clade", id))
	}
	if err != nil {
		return engine.Stats{}, fmt.Errorf("stats of %s: %w", id, err)
	}
	if !engine.PidsWanted(ctx) {
		return st, nil
	}
	st.Pids, err = e.pids(ctx, id)
	if err != nil {
		return engine.Stats{}, err
	}
	return st, nil
}

// pids counts the sandbox's processes as the sentry sees them.
func (e *Engine) pids(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(id), "ps", "--format", "json", id)...)
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if _, serr := e.state(ctx, id); serr != nil {
			return 0, serr // gone meanwhile: NotFound
		}
		return 0, fmt.Errorf("runsc ps %s: %w: %s", id, err, strings.TrimSpace(stderr.String()))
	}
	var pids []int
	if err := json.Unmarshal(out, &pids); err != nil {
		return 0, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	return len(pids), nil
}

// cgroupMounts says where the cgroup controllers clade reads are mounted.
type cgroupMounts struct {
	v2                      string // the unified hierarchy, when it is the only one
	cpuacct, memory, freeze string // cgroup v1 controllers (freeze: the freezer)
}

var cgroupsOnce = sync.OnceValue(func() cgroupMounts {
	var cg cgroupMounts
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroupMounts{cpuacct: "/sys/fs/cgroup/cpuacct", memory: "/sys/fs/cgroup/memory"}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		mnt := fields[4]
		switch tail[0] {
		case "cgroup2":
			if mnt == "/sys/fs/cgroup" {
				cg.v2 = mnt
			}
		case "cgroup":
			for _, o := range strings.Split(tail[2], ",") {
				switch o {
				case "cpuacct":
					cg.cpuacct = mnt
				case "memory":
					cg.memory = mnt
				case "freezer":
					cg.freeze = mnt
				}
			}
		}
	}
	if cg.memory != "" {
		cg.v2 = "" // hybrid: runsc uses the v1 controllers
	}
	return cg
})

func readCgroupV1(cpuDir, memDir string) (engine.Stats, error) {
	var st engine.Stats
	var err error
	if st.CPUNanos, err = readUint(filepath.Join(cpuDir, "cpuacct.usage")); err != nil {
		return st, err
	}
	usage, err := readUint(filepath.Join(memDir, "memory.usage_in_bytes"))
	if err != nil {
		return st, err
	}
	inactive, _ := statField(filepath.Join(memDir, "memory.stat"), "total_inactive_file")
	st.MemoryBytes = sub(usage, inactive)
	if lim, err := readUint(filepath.Join(memDir, "memory.limit_in_bytes")); err == nil && lim < 1<<62 {
		st.MemoryLimitBytes = lim
	}
	return st, nil
}

func readCgroupV2(dir string) (engine.Stats, error) {
	var st engine.Stats
	usec, err := statField(filepath.Join(dir, "cpu.stat"), "usage_usec")
	if err != nil {
		return st, err
	}
	st.CPUNanos = usec * 1000
	usage, err := readUint(filepath.Join(dir, "memory.current"))
	if err != nil {
		return st, err
	}
	inactive, _ := statField(filepath.Join(dir, "memory.stat"), "inactive_file")
	st.MemoryBytes = sub(usage, inactive)
	if lim, err := readUint(filepath.Join(dir, "memory.max")); err == nil { // "max" fails: no limit
		st.MemoryLimitBytes = lim
	}
	return st, nil
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// statField returns KEY's value in a flat-keyed cgroup file (memory.stat,
// cpu.stat).
func statField(path, key string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}
