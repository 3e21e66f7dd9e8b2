package testenv

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// FindMarkers returns, for each of markers found, where: the raw bytes of
// every regular file under root (except under skip, when set) and of every
// deleted file under root that a process still holds open (a running
// sandbox's upper layer is one) are searched.
func FindMarkers(root, skip string, markers []string) map[string][]string {
	found := map[string][]string{}
	look := func(name, p string) {
		for _, m := range fileMarkers(p, markers) {
			found[m] = append(found[m], name)
		}
	}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && skip != "" && p == skip {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			look(p, p)
		}
		return nil
	})
	procs, _ := os.ReadDir("/proc")
	for _, pr := range procs {
		fds, _ := os.ReadDir(filepath.Join("/proc", pr.Name(), "fd"))
		for _, fd := range fds {
			p := filepath.Join("/proc", pr.Name(), "fd", fd.Name())
			target, err := os.Readlink(p)
			if err != nil || !strings.HasPrefix(target, root+"/") || !strings.HasSuffix(target, " (deleted)") {
				continue
			}
			if skip != "" && strings.HasPrefix(target, skip+"/") {
				continue
			}
			look(p+" -> "+target, p)
		}
	}
	return found
}

// scanChunk is how much of a file fileMarkers reads at a time.
const scanChunk = 4 << 20

// fileMarkers returns the markers the file at p holds. It reads the file's
// data only, in chunks: SEEK_DATA and SEEK_HOLE skip the holes of a sparse
// file (a sandbox's upper layer is a 1 GiB file of a few blocks, read whole
// at each scan before), and a marker is never in a hole. Where the file
// system cannot tell, the whole file is data.
func fileMarkers(p string, markers []string) []string {
	if len(markers) == 0 {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	longest := 0
	for _, m := range markers {
		longest = max(longest, len(m))
	}
	seen := make([]bool, len(markers))
	buf := make([]byte, scanChunk+longest)
	fd := int(f.Fd())
	for off := int64(0); ; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			data = off
		}
		// To the end if the file system cannot tell (or the file grows
		// meanwhile: what a writer adds is read, as a whole read would).
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil || hole <= data {
			hole = math.MaxInt64
		}
		// [data, hole): read in chunks, the last longest-1 bytes of one
		// kept before the next, so a marker across a boundary is found.
		carry, pos := 0, data
		for pos < hole {
			n, err := f.ReadAt(buf[carry:carry+int(min(scanChunk, hole-pos))], pos)
			b := buf[:carry+n]
			for i, m := range markers {
				if !seen[i] && bytes.Contains(b, []byte(m)) {
					seen[i] = true
				}
			}
			carry = min(len(b), longest-1)
			copy(buf, b[len(b)-carry:])
			pos += int64(n)
			if err != nil { // the end, or unreadable
				break
			}
		}
		if pos < hole {
			break // the end came first
		}
		off = hole
	}
	var out []string
	for i, m := range markers {
		if seen[i] {
			out = append(out, m)
		}
	}
	return out
}
