package soak_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// loopFS makes a small ext4 file system in an image file under a temp dir
// and mounts it; at the end of the test it fails the test if anything is
// still mounted below it (a mount the daemon left) and unmounts it all.
// Register it before the daemon, so that its cleanup runs after the
// daemon's.
func loopFS(t *testing.T, dir string, sizeMiB int64) string {
	t.Helper()
	img := filepath.Join(dir, "fs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(sizeMiB << 20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// -m 0: no blocks reserved for root (the daemon is root: it would
	// write into them and the disk would never look full to it).
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop %s: %v\n%s", img, err, out)
	}
	t.Cleanup(func() {
		// Deepest first; a mount below the file system's root is one the
		// daemon (or a sandbox) left behind after it stopped.
		mounts := mountsUnder(mnt)
		for _, m := range mounts {
			if m != mnt {
				t.Errorf("still mounted after the daemon stopped: %s", m)
			}
		}
		for _, m := range mounts {
			if err := syscall.Unmount(m, 0); err != nil {
				t.Errorf("umount %s: %v (unmounting lazily)", m, err)
				_ = syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
		if left := mountsUnder(mnt); len(left) > 0 {
			t.Errorf("could not unmount %v", left)
		}
	})
	return mnt
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// fill takes every free block of the file system holding dir into a file
// there: the space is allocated at once, then written a MiB at a time until
// the file system answers ENOSPC. It returns the bytes taken.
func fill(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, err
	}
	size := int64(st.Bavail) * st.Bsize
	// Whatever fallocate could not take, writes take below.
	if size > 0 {
		for size > 0 {
			if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err == nil {
				break
			}
			size -= size / 8
			if size < 1<<20 {
				size = 0
			}
		}
	}
	if _, err := f.Seek(size, 0); err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	total := size
	for {
		n, err := f.Write(buf)
		total += int64(n)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			return total, err
		}
	}
	// Small writes for the last partial blocks.
	for {
		n, err := f.Write(buf[:4096])
		total += int64(n)
		if err != nil {
			break
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		return total, fmt.Errorf("sync filler: %w", err)
	}
	return total, nil
}
