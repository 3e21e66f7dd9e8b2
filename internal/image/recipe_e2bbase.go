package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// E2BBase is the built-in image E2B's `base` template runs on: what E2B's
// own base template holds (Python 3 as python and python3 with pip, Node.js
// and npm, git, curl, wget, sudo, procps) and a user `user` (uid 1000,
// passwordless sudo) whose home is the working directory. It is built from
// Debian's packages like the default image, which stays lean for clade's
// own API (a quarter of the size; see docs/e2b.md).
const E2BBase = "e2b-base"

// The E2B account every E2B SDK assumes.
const (
	e2bUser = "user"
	e2bUID  = 1000
	e2bHome = "/home/user"
)

func init() {
	RegisterRecipe(Recipe{
		Name:  E2BBase,
		About: "E2B's base: python3, pip, nodejs, npm, git, curl, wget, sudo, procps and a user `user`",
		Include: []string{"python3", "python-is-python3", "git", "curl", "wget", "sudo", "procps",
			"ca-certificates", "bash", "less", "unzip", "xz-utils"},
		Apt:  []string{"python3-pip", "python3-venv", "nodejs", "npm"},
		Post: addE2BUser,
	})
}

// addE2BUser writes the account of E2B's `user` into the new root: passwd,
// group (also in group sudo), shadow (no password) and a sudoers entry.
func addE2BUser(_ context.Context, rootfs string) error {
	files := []struct{ path, line, key string }{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d::%s:/bin/bash", e2bUser, e2bUID, e2bUID, e2bHome), e2bUser + ":"},
		{"etc/group", fmt.Sprintf("%s:x:%d:", e2bUser, e2bUID), e2bUser + ":"},
		{"etc/shadow", e2bUser + ":!:20000::::::", e2bUser + ":"},
	}
	for _, f := range files {
		if err := appendLine(rootfs, f.path, f.line, f.key); err != nil {
			return err
		}
	}
	if err := addToGroup(rootfs, "sudo", e2bUser); err != nil {
		return err
	}
	if err := writeUnder(rootfs, "etc/sudoers.d/"+e2bUser, []byte(e2bUser+" ALL=(ALL:ALL) NOPASSWD: ALL\n"), 0o440); err != nil {
		return err
	}
	home, err := beneath(rootfs, strings.TrimPrefix(e2bHome, "/"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(home, 0o750); err != nil {
		return err
	}
	for _, dot := range []string{".bashrc", ".profile"} {
		if b, err := os.ReadFile(filepath.Join(rootfs, "etc", "skel", dot)); err == nil {
			_ = os.WriteFile(filepath.Join(home, dot), b, 0o644)
			_ = os.Lchown(filepath.Join(home, dot), e2bUID, e2bUID)
		}
	}
	return os.Lchown(home, e2bUID, e2bUID)
}

// beneath joins rel to rootfs, refusing a path whose existing parts are
// symbolic links: a fresh debootstrap root has none where we write, so one
// there is a mistake, never followed out of the root.
func beneath(rootfs, rel string) (string, error) {
	p := rootfs
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		if part == ".." || part == "" {
			return "", fmt.Errorf("bad path %q in the image", rel)
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("%s in the image is a symbolic link: not written through", rel)
		}
	}
	return p, nil
}

func writeUnder(rootfs, rel string, b []byte, mode os.FileMode) error {
	p, err := beneath(rootfs, rel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, b, mode); err != nil {
		return err
	}
	return os.Chmod(p, mode)
}

// appendLine adds line to the account file rel unless a line starts with
// key already.
func appendLine(rootfs, rel, line, key string) error {
	p, err := beneath(rootfs, rel)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key) {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(p); err == nil {
		mode = fi.Mode().Perm()
	}
	return os.WriteFile(p, append(b, line+"\n"...), mode)
}

// addToGroup adds member to group's member list in etc/group, if the group
// exists.
func addToGroup(rootfs, group, member string) error {
	p, err := beneath(rootfs, "etc/group")
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) != 4 || f[0] != group {
			continue
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == member {
				return nil
			}
		}
		if f[3] != "" {
			f[3] += ","
		}
		f[3] += member
		lines[i] = strings.Join(f, ":")
	}
	return os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o644)
}
