package testenv

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FindMarkers returns, for each of markers found, where: the raw bytes of
// every regular file under root (except under skip, when set) and of every
// deleted file under root that a process still holds open (a running
// sandbox's upper layer is one) are searched.
func FindMarkers(root, skip string, markers []string) map[string][]string {
	found := map[string][]string{}
	look := func(name string, b []byte) {
		for _, m := range markers {
			if bytes.Contains(b, []byte(m)) {
				found[m] = append(found[m], name)
			}
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
			if b, err := os.ReadFile(p); err == nil {
				look(p, b)
			}
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
			if b, err := os.ReadFile(p); err == nil {
				look(p+" -> "+target, b)
			}
		}
	}
	return found
}
