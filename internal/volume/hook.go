package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
	"golang.org/x/sys/unix"
)

// The Manager is the sandbox lifecycle's volume hook: it mounts a
// sandbox's volumes before the engine starts, restores or wakes it, and
// lets go of them once the engine has.

// Name implements sandbox.Hook.
func (m *Manager) Name() string { return "volumes" }

// CompleteCreate checks and resolves the volumes of a new sandbox.
func (m *Manager) CompleteCreate(o *store.Options) error {
	return m.Resolve(context.Background(), o.Volumes)
}

// BeforeStart mounts rec's volumes on the host (a restored sandbox's own
// copies are made first, from its snapshot's) and adds them to spec.
func (m *Manager) BeforeStart(ctx context.Context, rec store.Sandbox, spec *engine.Spec) error {
	for _, vm := range rec.Opts.Volumes {
		if err := notAFile(spec.RootFS, vm.Path); err != nil {
			return err
		}
	}
	for i, vm := range rec.Opts.Volumes {
		data, mnt := m.source(rec.ID, i, vm)
		if ownCopy(vm) {
			if err := m.ensureCopy(rec, i, vm, data); err != nil {
				return fmt.Errorf("volume %s: %w", vm.Name, err)
			}
		} else if _, err := os.Stat(data); err != nil {
			return errdefs.New(errdefs.NotFound, "volume %s of sandbox %s is gone (removed?): %v", vm.Name, rec.ID, err)
		}
		check := func() error { return nil }
		if !ownCopy(vm) {
			// A volume rm that passed its check of the users before this
			// sandbox was recorded has marked the volume removing (under
			// mu, as use runs): it must not be mounted now.
			check = func() error {
				v, err := m.cfg.Store.GetVolume(ctx, vm.Volume)
				if errdefs.IsNotFound(err) || (err == nil && v.State != store.VolumeReady) {
					return errdefs.New(errdefs.NotFound, "volume %s of sandbox %s is being removed", vm.Name, rec.ID)
				}
				return err
			}
		}
		if err := m.use(ctx, rec.ID, vm, data, mnt, check); err != nil {
			return fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		spec.Mounts = append(spec.Mounts, engine.Mount{Source: mnt, Destination: vm.Path, ReadOnly: vm.ReadOnly})
	}
	return nil
}

// notAFile refuses a volume path that is (or goes through) a file other
// than a directory in the image at rootfs (runsc cannot mount a directory
// there and fails with nothing the user could act on), or that the
// image's symlinks lead to a path the sandbox needs (/.clade, /proc, ...:
// a volume there would hide the agent or its socket). Symlinks are
// followed inside the root, as runsc does; the walk stops at the first
// missing component (runsc makes the rest).
func notAFile(rootfs, p string) error {
	if rootfs == "" {
		return nil
	}
	res, file, err := resolveIn(rootfs, p)
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "volume path %s: %v: pick another path", p, err)
	}
	if file != "" {
		return errdefs.New(errdefs.InvalidArgument, "volume path %s: %s is a file in the image, not a directory: mount the volume at a directory or a new path", p, file)
	}
	if res == "/" {
		return errdefs.New(errdefs.InvalidArgument, "volume path %s leads, through the image's symlinks, to /: pick another path", p)
	}
	// p itself passed ValidPath; where the image's symlinks take it must too.
	if r := covers(res); r != "" && res != p {
		return errdefs.New(errdefs.InvalidArgument, "volume path %s leads, through the image's symlinks, to %s, which covers %s that the sandbox needs: pick another path", p, res, r)
	}
	return nil
}

// resolveIn resolves guest path p in the image at rootfs: symlinks are
// followed inside the root ('..' stops at it), up to the first missing
// component, after which the rest is joined as it is. file is the first
// component that exists and is not a directory, if any.
func resolveIn(rootfs, p string) (res, file string, err error) {
	parts := strings.Split(p, "/")
	cur := "/"
	for links := 0; len(parts) > 0; {
		part := parts[0]
		parts = parts[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, part)
		fi, err := os.Lstat(filepath.Join(rootfs, next))
		if err != nil {
			return path.Join(append([]string{next}, parts...)...), "", nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			if links++; links > 40 {
				return "", "", errors.New("too many levels of symbolic links in the image")
			}
			target, err := os.Readlink(filepath.Join(rootfs, next))
			if err != nil {
				return "", "", err
			}
			if strings.HasPrefix(target, "/") {
				cur = "/"
			}
			parts = append(strings.Split(target, "/"), parts...)
		case !fi.IsDir():
			return "", next, nil
		default:
			cur = next
		}
	}
	return cur, "", nil
}

// ensureCopy makes a restored sandbox's own copy of its i-th volume from
// its snapshot's, unless it has one (it is waking).
func (m *Manager) ensureCopy(rec store.Sandbox, i int, vm store.VolumeMount, img string) error {
	if _, err := os.Stat(img); err == nil {
		return nil
	}
	if rec.Snapshot == "" {
		return errdefs.New(errdefs.NotFound, "sandbox %s has no copy of its volume and no snapshot to make one from", rec.ID)
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return err
	}
	tmp := img + ".tmp"
	_ = os.RemoveAll(tmp) // a killed daemon's half copy
	if err := cloneData(m.snapshotImage(rec.Snapshot, i, vm), tmp); err != nil {
		return err
	}
	// The copy grows as the child writes: its room is taken now (reserve).
	// An encrypted volume's copy is a gocryptfs directory: its ciphertext
	// is reserved.
	res := reserve
	if len(vm.Key) != 0 {
		res = reserveCipher
	}
	if err := res(tmp); err != nil {
		return errors.Join(err, os.RemoveAll(tmp))
	}
	return os.Rename(tmp, img)
}

// use mounts data at mnt unless it is mounted (an encrypted volume's
// plain view first), and records sandbox id as one of its users; check,
// run under mu, may refuse it first.
func (m *Manager) use(ctx context.Context, id string, vm store.VolumeMount, data, mnt string, check func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := check(); err != nil {
		return err
	}
	if mounted(mnt) {
		// A daemon killed while a snapshot copied the volume left it
		// frozen; no copy runs now (it would hold mu).
		thaw(mnt)
	} else if len(m.users[mnt]) == 0 {
		img := data
		if len(vm.Key) > 0 {
			var err error
			if img, err = m.openView(ctx, vm.Volume, vm.Key, data, mnt); err != nil {
				return err
			}
		}
		if err := mountImage(img, mnt, false); err != nil {
			return errors.Join(err, closeView(mnt))
		}
	}
	if m.users[mnt] == nil {
		m.users[mnt] = map[string]bool{}
	}
	m.users[mnt][id] = true
	return nil
}

// release forgets sandbox id as a user of its mounts and unmounts those
// nobody else uses.
func (m *Manager) release(rec store.Sandbox) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for i, vm := range rec.Opts.Volumes {
		_, mnt := m.source(rec.ID, i, vm)
		delete(m.users[mnt], rec.ID)
		if len(m.users[mnt]) > 0 {
			continue
		}
		delete(m.users, mnt)
		if err := unmount(mnt); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(mnt); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
		errs = append(errs, closeView(mnt))
	}
	return errors.Join(errs...)
}

// AfterStart implements sandbox.Hook.
func (m *Manager) AfterStart(context.Context, store.Sandbox, engine.Sandbox) error { return nil }

// AfterStop unmounts what only rec used. It is idempotent.
func (m *Manager) AfterStop(_ context.Context, rec store.Sandbox) error { return m.release(rec) }

// AfterRemove deletes rec's own copies of its volumes. It is idempotent.
func (m *Manager) AfterRemove(_ context.Context, rec store.Sandbox) error {
	return errors.Join(m.release(rec), os.RemoveAll(filepath.Join(m.cfg.Dir, "sandboxes", rec.ID)))
}

// SnapshotOptions returns the options a snapshot of rec records: its
// children mount their own copies of rec's volumes, except shared ones.
// stop says the snapshot must stop rec while its volumes are copied.
func (m *Manager) SnapshotOptions(rec store.Sandbox) (store.Options, bool) {
	o := rec.Opts
	o.Volumes = append([]store.VolumeMount(nil), rec.Opts.Volumes...)
	stop := false
	for i := range o.Volumes {
		if !o.Volumes[i].Shared {
			o.Volumes[i].Clone = m.cloneMethod
			stop = true
		}
	}
	return o, stop
}

// SnapshotTaken copies rec's unshared volumes into snapshot sn. It runs
// while rec's engine sandbox is stopped (its checkpoint flushed every
// write to the volume); other sandboxes that mount the same volume are
// held off by freezing its file system for the copy.
func (m *Manager) SnapshotTaken(ctx context.Context, rec store.Sandbox, sn store.Snapshot) error {
	for i, vm := range rec.Opts.Volumes {
		if vm.Shared {
			continue
		}
		img, mnt := m.source(rec.ID, i, vm)
		dst := m.snapshotImage(sn.ID, i, vm)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if err := m.copyFrozen(img, mnt, dst); err != nil {
			return fmt.Errorf("copy volume %s into snapshot %s: %w", vm.Name, sn.ID, err)
		}
	}
	return nil
}

// copyFrozen copies img (or an encrypted volume's directory) to dst;
// while it is mounted at mnt its file system is frozen (flushed, through
// the plain view to the ciphertext, and writers held) for the copy.
func (m *Manager) copyFrozen(img, mnt, dst string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mounted(mnt) {
		f, err := os.Open(mnt)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
			return fmt.Errorf("freeze %s: %w", mnt, err)
		}
		defer unix.IoctlSetInt(int(f.Fd()), fiThaw, 0)
	}
	err := cloneData(img, dst)
	m.crashPoint("volume-copy-frozen")
	return err
}

// crashPoint kills the process at the named point when configured to.
func (m *Manager) crashPoint(name string) {
	if m.cfg.CrashAt == name {
		m.log.Warn("crashing on purpose", "point", name)
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
}

// SnapshotRemoved deletes snapshot sn's copies. It is idempotent.
func (m *Manager) SnapshotRemoved(_ context.Context, sn store.Snapshot) error {
	return os.RemoveAll(filepath.Join(m.cfg.Dir, "snapshots", sn.ID))
}

// Reconcile runs after a restart: running sandboxes keep their mounts (a
// killed daemon left them mounted); every other mount is undone; copies of
// sandboxes and snapshots nobody records, and volumes half created or half
// removed, are deleted.
func (m *Manager) Reconcile(ctx context.Context, running, all []store.Sandbox) error {
	var errs []error
	m.mu.Lock()
	m.users = map[string]map[string]bool{}
	for _, rec := range running {
		for i, vm := range rec.Opts.Volumes {
			_, mnt := m.source(rec.ID, i, vm)
			if !mounted(mnt) {
				m.log.Warn("reconcile: running sandbox's volume is not mounted on the host", "sandbox", rec.ID, "volume", vm.Name)
			} else {
				thaw(mnt) // a killed snapshot may have left it frozen
			}
			if m.users[mnt] == nil {
				m.users[mnt] = map[string]bool{}
			}
			m.users[mnt][rec.ID] = true
		}
	}
	ents, _ := os.ReadDir(filepath.Join(m.cfg.Dir, "mnt"))
	for _, e := range ents {
		mnt := m.mountPoint(e.Name())
		if len(m.users[mnt]) > 0 || strings.HasPrefix(e.Name(), "c") {
			continue
		}
		m.log.Info("reconcile: unmounting an unused volume", "mount", e.Name())
		if err := unmount(mnt); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.Remove(mnt))
	}
	// Encrypted volumes' plain views, once the loop mounts on them are off
	// (a gocryptfs the killed daemon left is unmounted, and so exits).
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), "c")
		if !ok || len(m.users[m.mountPoint(name)]) > 0 {
			continue
		}
		m.log.Info("reconcile: unmounting an unused encrypted volume view", "mount", e.Name())
		errs = append(errs, closeView(m.mountPoint(name)))
	}
	m.mu.Unlock()
	errs = append(errs, os.RemoveAll(filepath.Join(m.cfg.Dir, "tmp")), os.MkdirAll(filepath.Join(m.cfg.Dir, "tmp"), 0o700))

	known := map[string]bool{}
	for _, rec := range all {
		known[rec.ID] = true
	}
	errs = append(errs, removeUnknown(filepath.Join(m.cfg.Dir, "sandboxes"), known, m))
	snaps, err := m.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	known = map[string]bool{}
	for _, sn := range snaps {
		known[sn.ID] = true
	}
	errs = append(errs, removeUnknown(filepath.Join(m.cfg.Dir, "snapshots"), known, m))
	vols, err := m.cfg.Store.ListVolumes(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	known = map[string]bool{}
	for _, v := range vols {
		if v.State == store.VolumeReady {
			known[v.ID] = true
			continue
		}
		m.log.Info("reconcile: removing a half-made or half-removed volume", "volume", v.ID, "name", v.Name, "state", v.State)
		if err := m.removeFiles(v.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, m.cfg.Store.DeleteVolume(ctx, v.ID))
	}
	errs = append(errs, removeUnknown(filepath.Join(m.cfg.Dir, "named"), known, m))
	return errors.Join(errs...)
}

// removeUnknown deletes the entries of dir not named in known.
func removeUnknown(dir string, known map[string]bool, m *Manager) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if known[e.Name()] || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		m.log.Info("reconcile: removing volume files nobody records", "path", filepath.Join(dir, e.Name()))
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// The freeze ioctls (linux/fs.h _IOWR('X', 119/120, int)); x/sys has no
// names for them.
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)
