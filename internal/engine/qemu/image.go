package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/clade-sandbox/clade/internal/vminit"
)

// cpio writes an initramfs in the newc format the kernel unpacks.
type cpio struct {
	buf bytes.Buffer
	ino int
}

func (c *cpio) entry(name string, mode uint32, data []byte, rmajor, rminor int) {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.buf.WriteString(hdr)
	c.buf.WriteString(name)
	c.buf.WriteByte(0)
	c.pad()
	c.buf.Write(data)
	c.pad()
}

func (c *cpio) pad() {
	for c.buf.Len()%4 != 0 {
		c.buf.WriteByte(0)
	}
}

func (c *cpio) dir(name string)                         { c.entry(name, syscall.S_IFDIR|0o755, nil, 0, 0) }
func (c *cpio) file(name string, b []byte, perm uint32) { c.entry(name, syscall.S_IFREG|perm, b, 0, 0) }

func (c *cpio) bytes() []byte {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.buf.Bytes()
}

// buildInitramfs writes the engine's initramfs to dst: the agent (its own
// first stage, see package vminit), the guest kernel's modules and the
// marker that tells the agent it boots a VM. It is rewritten only when its
// content changes.
func buildInitramfs(agent []byte, modulesDir, dst string) error {
	var c cpio
	for _, d := range []string{"dev", "proc", "sys", "mnt", "modules", strings.TrimPrefix(vminit.AgentDir, "/")} {
		c.dir(d)
	}
	c.entry("dev/console", syscall.S_IFCHR|0o600, nil, 5, 1)
	c.file(strings.TrimPrefix(vminit.Marker, "/"), nil, 0o644)
	c.file(strings.TrimPrefix(vminit.AgentDir, "/")+"/clade-agent", agent, 0o755)
	for _, m := range vminit.Modules {
		b, err := os.ReadFile(filepath.Join(modulesDir, m+".ko"))
		if err != nil {
			return fmt.Errorf("guest kernel module %s: %w: run `make deps-qemu`", m, err)
		}
		c.file("modules/"+m+".ko", b, 0o644)
	}
	out := c.bytes()
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, out) {
		return nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// installLauncher writes the agent binary to dst (the engine's launcher,
// see nothp), aside and renamed so that a QEMU being started keeps the old
// inode.
func installLauncher(agent []byte, dst string) error {
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, agent) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, agent, 0o700); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// rootImage returns an ext4 image of rootfs, building it on first use
// (mkfs.ext4 -d: no loop device or mount needed). Images are named by the
// root's path and modification time and shared read-only by every sandbox
// of the image.
func (e *Engine) rootImage(ctx context.Context, rootfs string) (string, error) {
	fi, err := os.Stat(rootfs)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("image root %s: not a directory (%v)", rootfs, err)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d", rootfs, fi.ModTime().UnixNano())))
	dst := filepath.Join(e.imgDir, hex.EncodeToString(sum[:8])+".ext4")
	e.imgMu.Lock()
	defer e.imgMu.Unlock()
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	var size int64
	var files int64
	_ = filepath.WalkDir(rootfs, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		files++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += (fi.Size() + 4095) &^ 4095
			}
		}
		return nil
	})
	mib := (size+files*4096)*6/5>>20 + 64
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", "clade-root",
		"-N", fmt.Sprint(files+4096), "-E", "root_owner=0:0", "-d", rootfs, tmp, fmt.Sprintf("%dM", mib))
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("mkfs.ext4 -d %s: %w: %s", rootfs, err, out)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	return dst, nil
}
