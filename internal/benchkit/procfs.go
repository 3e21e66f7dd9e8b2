package benchkit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/internal/hostinfo"
)

// meminfo returns /proc/meminfo's fields in KiB.
func meminfo() (hostinfo.MemInfo, error) { return hostinfo.ReadMemInfo() }

// memAvailableMiB is the kernel's estimate of memory available for new
// work without swapping: page cache counts as available, a sandbox's
// memory file (shmem) does not.
func memAvailableMiB() (float64, error) {
	m, err := meminfo()
	if err != nil {
		return 0, err
	}
	v, ok := m["MemAvailable"]
	if !ok {
		return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
	}
	return float64(v) / 1024, nil
}

// processesOf returns the pids of host processes whose command line
// contains any of ids. runsc puts the container id (and clade's per-id
// overlay dir) on the command line of every process of a sandbox: the
// sandbox itself, its gofer and the systrap stubs it forks.
func processesOf(ids []string) []int {
	if len(ids) == 0 {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, id := range ids {
			if bytes.Contains(b, []byte(id)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// pssMiB sums the proportional set size of pids: shared pages are split
// among the processes that map them, so the sum over a set of sandboxes
// is what they cost together. Processes that exited meanwhile count 0.
func pssMiB(pids []int) float64 {
	var kib int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					n, _ := strconv.ParseInt(f[0], 10, 64)
					kib += n
				}
				break
			}
		}
	}
	return float64(kib) / 1024
}

// cgroupMiB sums anonymous and shared memory (a sandbox's memory file is
// shmem) charged to the memory cgroups of pids, each named for one of ids.
// Unlike MemAvailable it is blind to the rest of the host, so it stays
// exact on a busy machine.
func cgroupMiB(ids []string, pids []int) (float64, error) {
	seen := map[string]bool{}
	var total int64
	for _, pid := range pids {
		dir, v2 := memoryCgroup(pid)
		if dir == "" || seen[dir] {
			continue
		}
		seen[dir] = true
		if !slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(dir, id) }) {
			return 0, errSharedCgroup
		}
		stat, err := os.ReadFile(dir + "/memory.stat")
		if err != nil {
			return 0, err
		}
		total += anonShmem(string(stat), v2)
	}
	if len(seen) == 0 {
		return 0, fmt.Errorf("no memory cgroup found for the sandbox processes")
	}
	return float64(total) / (1 << 20), nil
}

// errSharedCgroup: a child's memory cgroup is not its own (QEMU VMs run
// in the daemon's), so its counters are not the child's.
var errSharedCgroup = errors.New("the children have no memory cgroups of their own")

// anonShmem returns anonymous plus shared bytes of a memory.stat. v1 has
// both a cgroup's own counters (rss, shmem) and hierarchical ones
// (total_rss, total_shmem): take only the latter, or shmem counts twice.
func anonShmem(stat string, v2 bool) int64 {
	keys := []string{"total_rss", "total_shmem"}
	if v2 {
		keys = []string{"anon", "shmem"}
	}
	var n int64
	for line := range strings.SplitSeq(stat, "\n") {
		k, v, _ := strings.Cut(line, " ")
		if slices.Contains(keys, k) {
			b, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			n += b
		}
	}
	return n
}

// memoryCgroup returns the memory cgroup dir of pid: the v1 memory
// controller's, else the v2 unified one's (v2 true).
func memoryCgroup(pid int) (dir string, v2 bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", false
	}
	var unified string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			return "/sys/fs/cgroup/memory" + parts[2], false
		case parts[0] == "0" && parts[1] == "":
			unified = "/sys/fs/cgroup" + parts[2]
		}
	}
	if unified != "" {
		if _, err := os.Stat(unified + "/memory.stat"); err == nil {
			return unified, true
		}
	}
	return "", false
}

// cpuTicks sums the CPU time (user and system, of the processes and of
// their waited-for children) of processes whose command line contains any
// of substrs, in clock ticks.
func cpuTicks(substrs []string) int64 {
	ents, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !slices.ContainsFunc(substrs, func(s string) bool { return bytes.Contains(b, []byte(s)) }) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the parenthesised command name, which may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 15 {
			continue
		}
		for _, v := range f[11:15] { // utime stime cutime cstime
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	return ticks
}
