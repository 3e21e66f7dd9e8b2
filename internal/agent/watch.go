package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Bounds of OpWatch: what a host's requests (a client's paths) may make
// the agent hold.
const (
	// maxWatchChannels is how many watches the agent runs at once.
	maxWatchChannels = 64
	// maxWatchDirs is how many directories one recursive watch follows.
	maxWatchDirs = 8192
)

// watching counts the agent's running watches.
var watching atomic.Int32

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// watcher is one OpWatch: an inotify instance and the directories it
// follows, by watch descriptor, relative to root.
type watcher struct {
	ch        *channel
	root      string
	recursive bool
	f         *os.File
	fd        int
	dirs      map[int32]string
	wds       map[string]int32
}

// watch serves OpWatch: it arms inotify on the request's directory (and
// those below it), answers Started, then writes a WatchEvent line per
// change until the host closes the channel or the watch cannot go on.
func (ch *channel) watch() wire.ExitMsg {
	root := ch.req.Path
	if !path.IsAbs(root) || path.Clean(root) != root {
		return errExit(errdefs.New(errdefs.InvalidArgument, "watch %q: give an absolute, clean path", root))
	}
	if n := watching.Add(1); n > maxWatchChannels {
		watching.Add(-1)
		return errExit(errdefs.New(errdefs.ResourceExhausted, "the sandbox already runs %d watches: stop one first", maxWatchChannels))
	}
	defer watching.Add(-1)
	fi, err := os.Lstat(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errExit(errdefs.New(errdefs.NotFound, "watch %s: no such directory", root))
		}
		return errExit(fmt.Errorf("watch %s: %w", root, err))
	}
	if !fi.IsDir() {
		return errExit(errdefs.New(errdefs.InvalidArgument, "watch %s: not a directory", root))
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return errExit(fmt.Errorf("watch %s: inotify: %w", root, err))
	}
	// Non-blocking, so that the runtime's poller reads it and Close (the
	// host's abort) unblocks a read.
	w := &watcher{ch: ch, root: root, recursive: ch.req.Recursive, f: os.NewFile(uintptr(fd), "inotify"), fd: fd,
		dirs: map[int32]string{}, wds: map[string]int32{}}
	defer w.f.Close()
	ch.mu.Lock()
	if ch.aborted {
		ch.mu.Unlock()
		return errExit(errors.New("channel closed by host"))
	}
	ch.sock = w.f
	ch.mu.Unlock()
	if err := w.add("", false); err != nil {
		return errExit(err)
	}
	started, _ := json.Marshal(wire.StartedMsg{})
	_ = ch.s.conn.Write(wire.Started, ch.id, started)
	if err := w.loop(); err != nil {
		return errExit(err)
	}
	return wire.ExitMsg{}
}

// add follows the directory rel (and, for a recursive watch, those below
// it). With report, what it finds inside is reported as created (and
// files with content as written): it was made before the watch on it
// was armed, as in `mkdir -p d && echo x > d/f`.
func (w *watcher) add(rel string, report bool) error {
	if len(w.dirs) >= maxWatchDirs {
		return errdefs.New(errdefs.ResourceExhausted, "watch %s: more than %d directories to follow", w.root, maxWatchDirs)
	}
	full := filepath.Join(w.root, rel)
	wd, err := unix.InotifyAddWatch(w.fd, full, watchMask|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	if err != nil {
		if rel != "" && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) {
			return nil // gone already: its removal is reported
		}
		if errors.Is(err, unix.ENOSPC) {
			return errdefs.New(errdefs.ResourceExhausted, "watch %s: the sandbox's inotify watch limit is reached", w.root)
		}
		return fmt.Errorf("watch %s: %w", full, err)
	}
	w.dirs[int32(wd)] = rel
	w.wds[rel] = int32(wd)
	if !w.recursive && !report {
		return nil
	}
	ents, err := os.ReadDir(full)
	if err != nil {
		return nil // gone or unreadable: what inotify says counts
	}
	for _, e := range ents {
		name := path.Join(rel, e.Name())
		if report {
			if err := w.send("create", name); err != nil {
				return err
			}
			if info, err := e.Info(); err == nil && info.Mode().IsRegular() && info.Size() > 0 {
				if err := w.send("write", name); err != nil {
					return err
				}
			}
		}
		if w.recursive && e.IsDir() {
			if err := w.add(name, report); err != nil {
				return err
			}
		}
	}
	return nil
}

// drop stops following rel and the directories below it (moved away).
func (w *watcher) drop(rel string) {
	for r, wd := range w.wds {
		if r == rel || strings.HasPrefix(r, rel+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, r)
			delete(w.dirs, wd)
		}
	}
}

func (w *watcher) send(op, name string) error {
	b, _ := json.Marshal(wire.WatchEvent{Op: op, Name: name})
	_, err := w.ch.stdout.Write(append(b, '\n'))
	return err
}

// loop reads inotify until the watch ends.
func (w *watcher) loop() error {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil // the host closed the channel
			}
			return fmt.Errorf("watch %s: read inotify: %w", w.root, err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			off = end
			if err := w.handle(ev.Wd, ev.Mask, name); err != nil {
				return err
			}
		}
	}
}

func (w *watcher) handle(wd int32, mask uint32, name string) error {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return errdefs.New(errdefs.ResourceExhausted, "watch %s: the sandbox's inotify queue overflowed: events were lost", w.root)
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return nil // a directory dropped a moment ago
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		delete(w.wds, dir)
		if dir == "" {
			return errdefs.New(errdefs.NotFound, "watch %s: the directory was removed", w.root)
		}
		return nil
	}
	if dir == "" && mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		return errdefs.New(errdefs.NotFound, "watch %s: the directory was removed or moved", w.root)
	}
	if name == "" {
		return nil // the directory itself: its parent's watch says it
	}
	rel := path.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		if err := w.send("create", rel); err != nil {
			return err
		}
		if isDir && w.recursive {
			return w.add(rel, true)
		}
	case mask&unix.IN_MODIFY != 0:
		return w.send("write", rel)
	case mask&unix.IN_ATTRIB != 0:
		return w.send("chmod", rel)
	case mask&unix.IN_DELETE != 0:
		return w.send("remove", rel)
	case mask&unix.IN_MOVED_FROM != 0:
		if isDir {
			w.drop(rel)
		}
		return w.send("rename", rel)
	}
	return nil
}
