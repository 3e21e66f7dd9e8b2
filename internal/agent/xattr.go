package agent

import (
	"encoding/json"
	"errors"
	"path"
	"strings"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// checkXattrPrefix checks the prefix (user. namespace only: the agent
// runs as root, and trusted.* or security.* are not the host's to touch
// this way).
func checkXattrPrefix(prefix string) error {
	if !strings.HasPrefix(prefix, "user.") || strings.ContainsRune(prefix, 0) || len(prefix) > 64 {
		return errdefs.New(errdefs.InvalidArgument, "xattr prefix %.64q: give one in the user. namespace", prefix)
	}
	return nil
}

func checkXattrPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) || len(p) > unix.PathMax {
		return errdefs.New(errdefs.InvalidArgument, "xattr path %.64q: give an absolute, clean path", p)
	}
	return nil
}

func (ch *channel) xattrGet() wire.ExitMsg {
	prefix := ch.req.XattrPrefix
	if err := checkXattrPrefix(prefix); err != nil {
		return errExit(err)
	}
	if len(ch.req.Paths) > wire.MaxXattrPaths {
		return errExit(errdefs.New(errdefs.InvalidArgument, "%d paths: at most %d per request", len(ch.req.Paths), wire.MaxXattrPaths))
	}
	out := make([]map[string]string, len(ch.req.Paths))
	for i, p := range ch.req.Paths {
		if err := checkXattrPath(p); err != nil {
			return errExit(err)
		}
		out[i] = readXattrs(p, prefix)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return errExit(err)
	}
	return wire.ExitMsg{Info: b}
}

// readXattrs returns p's attributes named prefix+KEY, KEY -> value; nil
// when it has none, cannot be read, or holds more than MaxXattrBytes.
func readXattrs(p, prefix string) map[string]string {
	names, err := listXattrs(p)
	if err != nil {
		return nil
	}
	var out map[string]string
	total := 0
	val := make([]byte, wire.MaxXattrBytes)
	for _, name := range names {
		key, ok := strings.CutPrefix(name, prefix)
		if !ok || key == "" {
			continue
		}
		n, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue // removed since the list
			}
			return nil // ERANGE: bigger than the bound
		}
		total += len(name) + n
		if total > wire.MaxXattrBytes {
			return nil
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:n])
	}
	return out
}

// listXattrs lists p's attribute names (not following a final symlink).
func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 64<<10 {
			buf = make([]byte, 64<<10) // the kernel's XATTR_LIST_MAX
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

func (ch *channel) xattrSet() wire.ExitMsg {
	prefix, p := ch.req.XattrPrefix, ch.req.Path
	if err := checkXattrPrefix(prefix); err != nil {
		return errExit(err)
	}
	if err := checkXattrPath(p); err != nil {
		return errExit(err)
	}
	total := 0
	for k, v := range ch.req.Xattrs {
		if k == "" || strings.ContainsRune(k, 0) {
			return errExit(errdefs.New(errdefs.InvalidArgument, "xattr key %.64q: give a non-empty name", k))
		}
		total += len(prefix) + len(k) + len(v)
	}
	if total > wire.MaxXattrBytes {
		return errExit(errdefs.New(errdefs.InvalidArgument, "%d bytes of attributes: at most %d per file", total, wire.MaxXattrBytes))
	}
	names, err := listXattrs(p)
	if err != nil {
		return errExit(xattrErr(p, err))
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, prefix)
		if _, keep := ch.req.Xattrs[key]; !ok || keep {
			continue
		}
		if err := unix.Lremovexattr(p, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return errExit(xattrErr(p, err))
		}
	}
	for k, v := range ch.req.Xattrs {
		if err := unix.Lsetxattr(p, prefix+k, []byte(v), 0); err != nil {
			return errExit(xattrErr(p, err))
		}
	}
	return wire.ExitMsg{}
}

// xattrErr classes an error of p's attributes.
func xattrErr(p string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.New(errdefs.NotFound, "%s: no such file or directory", p)
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EPERM):
		return errdefs.New(errdefs.InvalidArgument, "%s: its file system keeps no user attributes here (a symlink, or no xattr support): %v", p, err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.E2BIG):
		return errdefs.New(errdefs.ResourceExhausted, "%s: no room for its attributes: %v", p, err)
	}
	return errdefs.Wrap(errdefs.Internal, err)
}
