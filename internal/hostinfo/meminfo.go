// Package hostinfo reads facts about the host the daemon runs on. It is the
// one reader of /proc/meminfo: admission control, the warm pool and the
// benchmarks all ask it.
package hostinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MemInfo is /proc/meminfo: every field in KiB, by name ("MemTotal",
// "MemAvailable", ...).
type MemInfo map[string]int64

// ReadMemInfo reads /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseMemInfo(f)
}

// ParseMemInfo parses text in /proc/meminfo's format ("Name:   123 kB").
// Lines it does not understand are skipped.
func ParseMemInfo(r io.Reader) (MemInfo, error) {
	m := MemInfo{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			m[strings.TrimSpace(k)] = n
		}
	}
	return m, sc.Err()
}

// MiB returns the field called name in MiB, or an error if it is missing.
func (m MemInfo) MiB(name string) (int64, error) {
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("no %s in /proc/meminfo", name)
	}
	return v >> 10, nil
}

// MemTotalMiB is the host's memory in MiB.
func MemTotalMiB() (int64, error) { return field("MemTotal") }

// MemAvailableMiB is the kernel's estimate of the memory available for new
// work without swapping, in MiB: page cache counts as available, a
// sandbox's memory file (shmem) does not.
func MemAvailableMiB() (int64, error) { return field("MemAvailable") }

func field(name string) (int64, error) {
	m, err := ReadMemInfo()
	if err != nil {
		return 0, err
	}
	return m.MiB(name)
}
