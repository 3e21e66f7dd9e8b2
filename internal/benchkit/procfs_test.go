package benchkit

import (
	"os"
	"testing"
)

func TestAnonShmem(t *testing.T) {
	// Trimmed from a sandbox's cgroup v1 memory.stat: the cgroup's own
	// counters and the hierarchical totals both appear.
	v1 := "cache 71020544\nrss 22085632\nshmem 71020544\nmapped_file 71012352\n" +
		"total_cache 71020544\ntotal_rss 22085632\ntotal_shmem 71020544\n"
	if got, want := anonShmem(v1, false), int64(22085632+71020544); got != want {
		t.Errorf("v1: %d, want %d (total_rss + total_shmem, each once)", got, want)
	}
	v2 := "anon 1000\nfile 5000\nshmem 300\nfile_mapped 7\n"
	if got := anonShmem(v2, true); got != 1300 {
		t.Errorf("v2: %d, want 1300", got)
	}
}

func TestProcfs(t *testing.T) {
	if _, err := memAvailableMiB(); err != nil {
		t.Fatal(err)
	}
	// This test process: its own command line holds its binary's name.
	self, _ := os.Executable()
	if pss := pssMiB([]int{os.Getpid()}); pss <= 0 {
		t.Errorf("PSS of this process = %v", pss)
	}
	if ticks := cpuTicks([]string{self}); ticks < 0 {
		t.Errorf("cpuTicks = %d", ticks)
	}
	if dir, _ := memoryCgroup(os.Getpid()); dir == "" {
		t.Log("no memory cgroup for this process (container without one?)")
	}
}
