package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/clade-sandbox/clade/internal/engine/gvisor/bundle"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Root views.
//
// runsc's gofer makes every bind mount's missing mount point (and its
// missing parents) with mkdir in the root it serves, on the host, before
// it remounts that root read-only (runsc/cmd/sandboxsetup/gofer_mount.go,
// SetupMounts). The root is the image's, shared by every sandbox of the
// image: a volume at /data would leave /data in the image for all of them.
// So a sandbox whose mounts need a mount point the image lacks gets a root
// of its own: a host overlayfs whose lower layer is the image root (never
// written) and whose upper layer, in the sandbox's directory, takes the
// mount points. It is mounted on the host only for the runsc call that
// starts the sandbox's gofer (run, restore, create): the gofer's mount
// namespace holds its own reference to it from then on, so the host's is
// detached right after, and no host mount outlives a start, a crash of the
// daemon included (New detaches what a killed daemon left). A restore may
// serve another root path (runsc validates everything but Root.Path) and
// the gofer makes the mount points again in the new view.
//
// Sandboxes whose mount points all exist in the image (no volumes, or
// volumes at directories the image has) keep the image root itself: no
// mount, nothing to undo.

const (
	viewRoot = "rootfs" // the view's mount point in the sandbox's directory
	viewDir  = "view"   // its upper and work directories
)

// needsView reports whether runsc's gofer would make something in rootfs
// for mounts: a bind mount whose destination, or one of its parents, is
// missing, or goes through a symlink (which the gofer resolves inside the
// root: what it makes then is not where a plain walk would look).
// Tmpfs mounts are the sentry's: their mount points live in the
// sandbox's own overlay, never on the host.
func needsView(rootfs string, mounts []bundle.Mount) bool {
	for _, m := range mounts {
		if m.Tmpfs {
			continue
		}
		cur := rootfs
		for _, part := range strings.Split(strings.Trim(m.Destination, "/"), "/") {
			if part == "" || part == "." || part == ".." {
				return true // not clean: let the gofer judge it, in a view
			}
			cur = filepath.Join(cur, part)
			fi, err := os.Lstat(cur)
			if err != nil || fi.Mode()&os.ModeSymlink != 0 {
				return true
			}
		}
	}
	return false
}

func (e *Engine) viewPath(id string) string { return filepath.Join(e.dir(id), viewRoot) }

// mountView mounts id's view of rootfs at viewPath(id) and returns it.
func (e *Engine) mountView(id, rootfs string) (string, error) {
	dir := e.dir(id)
	target, upper, work := e.viewPath(id), filepath.Join(dir, viewDir, "upper"), filepath.Join(dir, viewDir, "work")
	for _, d := range []string{target, upper, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", err
		}
	}
	// The view's root takes the upper layer's mode and owner, not the
	// image root's: the image root's they must be (a 0700 root keeps an
	// image's non-root user from every path).
	var st unix.Stat_t
	if err := unix.Stat(rootfs, &st); err != nil {
		return "", err
	}
	if err := errors.Join(unix.Chmod(upper, st.Mode&0o7777), os.Lchown(upper, int(st.Uid), int(st.Gid))); err != nil {
		return "", err
	}
	for _, p := range []string{rootfs, upper, work} {
		// overlayfs splits its options at ',' and its lower layers at ':'.
		if strings.ContainsAny(p, ",:\\") {
			return "", errdefs.New(errdefs.InvalidArgument, "path %q has a ',', ':' or '\\', which an overlay mount cannot name: use an images dir and data dir without them", p)
		}
	}
	// index=off: nothing is recorded about the lower layer, which other
	// sandboxes' views share. volatile: the upper layer (empty mount
	// points) is never synced, so the unmount after the start does not
	// sync the data dir's file system (measured: 8.6 -> 2.2 ms under
	// load); a view is never mounted again after a crash (each start makes
	// a new one). Kernels before 5.10 lack it: mounted without then.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off", rootfs, upper, work)
	err := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts+",volatile")
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
	}
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		// overlayfs makes its work directory at the mount.
		return "", errdefs.Wrap(errdefs.ResourceExhausted, fmt.Errorf("mount a view of the image root for the sandbox's mount points: the data dir's file system is out of space or inodes: free some: %w", err))
	}
	if err != nil {
		return "", fmt.Errorf("mount a view of the image root for the sandbox's mount points (overlayfs; mount volumes at directories the image has to do without): %w", err)
	}
	return target, nil
}

// dropView detaches id's view from the host, if mounted; a gofer that
// serves it keeps its own reference.
func (e *Engine) dropView(id string) error {
	return detachAll(e.viewPath(id))
}

// detachAll lazily unmounts everything stacked at p.
func detachAll(p string) error {
	for {
		err := unix.Unmount(p, unix.MNT_DETACH)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
}

// dropViews detaches every sandbox's view: at New, when no start is under
// way, any mounted one is a killed daemon's leftover.
func (e *Engine) dropViews() error {
	ents, err := os.ReadDir(e.sbRoot)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range ents {
		if d.IsDir() {
			errs = append(errs, e.dropView(d.Name()))
		}
	}
	return errors.Join(errs...)
}

// crashPoint kills the process at the named point when configured to.
func (e *Engine) crashPoint(name string) {
	if e.cfg.CrashAt == name {
		e.cfg.Log.Warn("crashing on purpose", "point", name)
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
}
