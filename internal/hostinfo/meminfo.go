// Package hostinfo reads facts about the host the daemon runs on. It is the
// one reader of /proc/meminfo: admission control, the warm pool and the
// benchmarks all ask it.
package hostinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
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
func MemTotalMiB() (int64, error) { return memTotal() }

// memTotal is read once: it does not change under a running daemon, and
// admission asks for it at every create.
var memTotal = sync.OnceValues(func() (int64, error) { return field("MemTotal") })

// MemAvailableMiB is the kernel's estimate of the memory available for new
// work without swapping, in MiB: page cache counts as available, a
// sandbox's memory file (shmem) does not.
// It reads the file into a buffer and parses that one line: admission
// asks at every create, and a claim from the hot pool is a millisecond.
func MemAvailableMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var buf [4096]byte
	n, err := io.ReadFull(f, buf[:])
	if err != nil && err != io.ErrUnexpectedEOF {
		return 0, err
	}
	return fieldOf(buf[:n], "MemAvailable")
}

// fieldOf returns the field called name of meminfo text b, in MiB.
func fieldOf(b []byte, name string) (int64, error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(k) != name {
			continue
		}
		fields := bytes.Fields(v)
		if len(fields) == 0 {
			break
		}
		n, err := strconv.ParseInt(string(fields[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad %s in /proc/meminfo: %q", name, line)
		}
		return n >> 10, nil
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", name)
}

func field(name string) (int64, error) {
	m, err := ReadMemInfo()
	if err != nil {
		return 0, err
	}
	return m.MiB(name)
}
