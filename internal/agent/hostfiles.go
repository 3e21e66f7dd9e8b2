package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// hostsMarker opens an /etc/hosts the agent wrote; one without it is the
// image's own and is left alone.
const hostsMarker = "# written by clade for this sandbox's hostname; remove this line to keep your own\n"

// writeHostFiles makes /etc/hostname and /etc/hosts name the sandbox's
// hostname, as container runtimes do. Images built with debootstrap carry
// their build host's /etc/hostname and no /etc/hosts, so `localhost` did
// not resolve (glibc asks DNS, and a sandbox without a network has none).
// A hosts file the agent wrote keeps every line but its hostname's (see
// hostsFor). Each file is replaced by a rename in the same directory (never written
// through a symlink); an /etc/hosts of the image's own, a hostname path
// that is not a regular file, or an /etc that is not a directory are
// left as they are. Errors are logged only: the sandbox runs without.
func (a *Agent) writeHostFiles(name string) {
	dir := a.cfg.Etc
	if dir == "" || name == "" {
		return
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return
	}
	// Ours to write: missing, one the agent wrote, or an empty placeholder
	// (images exported from a container runtime that mounted its own).
	if old, err := readRegular(filepath.Join(dir, "hosts")); os.IsNotExist(err) || err == nil && (len(old) == 0 || bytes.HasPrefix(old, []byte(hostsMarker))) {
		if len(old) == 0 {
			old = nil
		}
		a.replaceFile(dir, "hosts", old, hostsFor(old, name))
	}
	if old, err := readRegular(filepath.Join(dir, "hostname")); err == nil || os.IsNotExist(err) {
		a.replaceFile(dir, "hostname", old, name+"\n")
	}
}

// renameHostFiles rewrites the files for a new hostname after the
// identity frame is answered (a hot claim's answer does not wait for two
// file writes in the sandbox); every other request waits for it first
// (hostFilesDone).
func (a *Agent) renameHostFiles(name string) {
	a.hostFiles.Lock()
	go func() {
		defer a.hostFiles.Unlock()
		a.writeHostFiles(name)
	}()
}

// hostFilesDone waits for a rewrite under way.
func (a *Agent) hostFilesDone() {
	a.hostFiles.Lock()
	a.hostFiles.Unlock() //nolint:staticcheck // a wait, not a critical section
}

// hostLine is the prefix of the /etc/hosts line naming the sandbox.
const hostLine = "127.0.1.1\t"

// hostsFor is the /etc/hosts naming name: old (one the agent wrote, nil if
// none) with its hostname line replaced, every other line kept. The
// hostname is sent again at every wake and fork child's restore, and a
// user's `echo "10.0.0.5 db" >> /etc/hosts` must survive that.
func hostsFor(old []byte, name string) string {
	line := hostLine + name
	if old == nil {
		return hostsMarker + "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + line + "\n"
	}
	lines := strings.SplitAfter(string(old), "\n")
	done := false
	var b strings.Builder
	for _, l := range lines {
		if strings.HasPrefix(l, hostLine) {
			if done {
				continue
			}
			l, done = line+"\n", true
		}
		b.WriteString(l)
	}
	if !done {
		if s := b.String(); s != "" && !strings.HasSuffix(s, "\n") {
			b.WriteString("\n")
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// maxHostFile bounds what readRegular reads: an /etc/hosts or hostname
// larger than this is no file the agent wrote (and is left alone).
const maxHostFile = 1 << 20

// readRegular reads a regular file, opened once without following a
// symlink and without blocking (a FIFO a process in the sandbox swaps in
// must not stall the agent's read loop, where a hostname change is
// applied); anything else, or a file over maxHostFile, is an error that
// is not os.IsNotExist.
func readRegular(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", path, errors.Join(os.ErrInvalid, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errors.Join(os.ErrInvalid, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxHostFile {
		return nil, os.ErrInvalid
	}
	b, err := io.ReadAll(io.LimitReader(f, maxHostFile+1))
	if err == nil && len(b) > maxHostFile {
		err = os.ErrInvalid
	}
	return b, err
}

// replaceFile puts content at dir/name, which holds old (readRegular's),
// unless that is content already.
func (a *Agent) replaceFile(dir, name string, old []byte, content string) {
	path := filepath.Join(dir, name)
	if old != nil && string(old) == content {
		return
	}
	tmp := filepath.Join(dir, "."+name+".clade")
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		_, err = f.WriteString(content)
		err = errors.Join(err, f.Close())
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}
	if err != nil {
		a.cfg.Log.Warn("keeping the image's file", "file", path, "err", err)
	}
}
