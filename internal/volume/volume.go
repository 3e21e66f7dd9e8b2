// Package volume keeps named volumes: state that outlives sandboxes.
//
// A volume is an ext4 image file of a fixed size (the size limit: writes
// past it fail with ENOSPC inside the sandbox and never fill the host's
// disk beyond it). While sandboxes run with it, it is loop-mounted on the
// host and the engine bind-mounts that directory into each sandbox (runsc's
// gofer serves it). Nothing of a volume is in a memory checkpoint, so:
//
//   - sleep and wake keep a volume in place: the woken sandbox mounts the
//     same volume, nothing is copied;
//   - a snapshot copies each volume's image as it was when the sandbox was
//     checkpointed (the sandbox is stopped meanwhile, see Hook), and each
//     fork child gets its own copy of that (a reflink where the file system
//     has them, a copy of the allocated extents otherwise), unless the
//     volume was mounted shared, when every child mounts the volume itself.
//
// The Manager names everything it makes by volume, sandbox or snapshot id
// under its directory, so a repeated call is harmless and a restart can
// collect what a killed daemon left half made:
//
//	named/<volume id>/disk.img         a named volume
//	named/<volume id>/crypt/           an encrypted one's gocryptfs dir (crypt.go)
//	sandboxes/<sandbox id>/<i>.img     a restored sandbox's own copy of its i-th mount (.crypt/: encrypted)
//	snapshots/<snapshot id>/<i>.img    a snapshot's copy of its sandbox's i-th mount (.crypt/: encrypted)
//	mnt/<key>                          where an image is loop-mounted while in use
//	mnt/c<key>                         an encrypted image's plain view, while in use
//	tmp/                               exports being made (emptied at restart)
package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
	"golang.org/x/sys/unix"
)

// Sizes a volume may have.
const (
	MinSize     = 16 << 20
	MaxSize     = 16 << 40
	DefaultSize = 1 << 30
	// MaxMounts bounds the volumes one sandbox mounts.
	MaxMounts = 16
)

// Store is what volumes need of the store: their own records, and the
// sandboxes' and snapshots' (which volumes they mount).
type Store interface {
	store.Volumes
	ListSandboxes(ctx context.Context) ([]store.Sandbox, error)
	ListSnapshots(ctx context.Context) ([]store.Snapshot, error)
}

// Config configures a Manager.
type Config struct {
	// Dir holds the volumes' images and mount points.
	Dir   string
	Store Store
	Log   *slog.Logger
	// CrashAt names a point at which the process kills itself with
	// SIGKILL, for tests of restart safety ("volume-copy-frozen": a
	// snapshot's copy of a volume is made, its file system still frozen).
	CrashAt string
	// Sealer seals encrypted volumes' keys under the host key; without it
	// volume create --encrypt is refused.
	Sealer Sealer
}

// Manager creates, lists and removes named volumes, and (as a sandbox
// Hook) mounts them for the sandboxes that use them.
type Manager struct {
	cfg Config
	log *slog.Logger
	// cloneMethod is how this host clones a volume: CloneReflink when the
	// volume directory's file system shares extents, else CloneCopy.
	cloneMethod string

	mu sync.Mutex
	// users maps a mount point to the sandboxes running with it mounted.
	// Guarded by mu, as are the mounts themselves.
	users map[string]map[string]bool
}

// New makes the volume directory and probes whether it can reflink.
func New(cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, log: cfg.Log, users: map[string]map[string]bool{}}
	for _, d := range []string{"named", "sandboxes", "snapshots", "mnt", "tmp"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	m.cloneMethod = probeReflink(cfg.Dir)
	return m, nil
}

// CloneMethod says how fork children get their copies on this host.
func (m *Manager) CloneMethod() string { return m.cloneMethod }

// probeReflink clones a small file in dir to learn the clone method.
func probeReflink(dir string) string {
	src := filepath.Join(dir, ".probe-src")
	dst := filepath.Join(dir, ".probe-dst")
	defer os.Remove(src)
	defer os.Remove(dst)
	if err := os.WriteFile(src, []byte("probe"), 0o600); err != nil {
		return CloneCopy
	}
	method, err := cloneFile(src, dst)
	if err != nil {
		return CloneCopy
	}
	return method
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidName checks a volume name.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.InvalidArgument, "bad volume name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", name)
	}
	return nil
}

// reservedPaths are where the engine and the agent mount their own things.
var reservedPaths = []string{"/proc", "/dev", "/sys", "/.clade", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}

// ValidPath checks where a volume is mounted inside a sandbox: an absolute,
// clean path that is not / and does not cover what the sandbox needs.
func ValidPath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00:,") {
		return errdefs.New(errdefs.InvalidArgument, "bad volume path %q: use a clean absolute path other than / (no '..', no trailing '/', no ':' or ',')", p)
	}
	if r := covers(p); r != "" {
		return errdefs.New(errdefs.InvalidArgument, "volume path %q would cover %s, which the sandbox needs: pick another path", p, r)
	}
	return nil
}

// covers returns the reserved path that a volume at p would cover or
// mount under, or "".
func covers(p string) string {
	for _, r := range reservedPaths {
		if p == r || strings.HasPrefix(p, r+"/") || strings.HasPrefix(r, p+"/") {
			return r
		}
	}
	return ""
}

// Info is a volume with what inspect shows about it.
type Info struct {
	store.Volume
	// UsedBytes is what the volume's image takes on the host's disk.
	UsedBytes int64
	// Users are the sandboxes that mount the volume itself (not a copy).
	Users []string
	// Mounted says whether a running sandbox has it mounted now.
	Mounted bool
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (m *Manager) namedDir(id string) string   { return filepath.Join(m.cfg.Dir, "named", id) }
func (m *Manager) namedImage(id string) string { return filepath.Join(m.namedDir(id), "disk.img") }
func (m *Manager) mountPoint(key string) string {
	return filepath.Join(m.cfg.Dir, "mnt", key)
}

// Create makes a named volume of size bytes (0: DefaultSize). The image is
// sparse: it takes host disk as it is written, up to size. Errors:
// InvalidArgument, AlreadyExists, ResourceExhausted when the host has less
// free disk than size.
// With encrypt, the volume has a key of its own (see Export).
func (m *Manager) Create(ctx context.Context, name string, size int64, encrypt bool) (store.Volume, error) {
	return m.create(ctx, name, size, encrypt, nil)
}

// CreateWithKey makes an encrypted volume whose key is key (hex of
// KeySize bytes, as Export's key file holds it) rather than a random one,
// so that its owner holds the key from the start. Errors: as Create's;
// InvalidArgument for a malformed key (the message never shows it).
func (m *Manager) CreateWithKey(ctx context.Context, name string, size int64, key string) (store.Volume, error) {
	raw, err := parseKey(key)
	if err != nil {
		return store.Volume{}, err
	}
	return m.create(ctx, name, size, true, raw)
}

// create makes a volume; with encrypt, raw is its key (nil: a random one).
func (m *Manager) create(ctx context.Context, name string, size int64, encrypt bool, raw []byte) (store.Volume, error) {
	if err := ValidName(name); err != nil {
		return store.Volume{}, err
	}
	if size == 0 {
		size = DefaultSize
	}
	if size < MinSize || size > MaxSize {
		return store.Volume{}, errdefs.New(errdefs.InvalidArgument, "volume size %d bytes is out of range: use %d MiB to %d TiB", size, MinSize>>20, MaxSize>>40)
	}
	size = size &^ (4096 - 1)
	var fs unix.Statfs_t
	if err := unix.Statfs(m.cfg.Dir, &fs); err == nil && int64(fs.Bavail)*fs.Bsize < size {
		return store.Volume{}, errdefs.New(errdefs.ResourceExhausted, "volume %s of %d MiB does not fit: the host has %d MiB free; pick a smaller --size or free disk", name, size>>20, int64(fs.Bavail)*fs.Bsize>>20)
	}
	v := store.Volume{ID: newID(), Name: name, SizeBytes: size, State: store.VolumeCreating}
	if encrypt && raw != nil {
		if m.cfg.Sealer == nil {
			return store.Volume{}, errdefs.New(errdefs.InvalidArgument, "this daemon has no host key to seal volume keys with")
		}
		v.Key = m.cfg.Sealer.Seal(raw, keyAD(v.ID))
	} else if encrypt {
		var err error
		if _, v.Key, err = m.newKey(v.ID); err != nil {
			return store.Volume{}, err
		}
	}
	if err := m.cfg.Store.InsertVolume(ctx, v); err != nil {
		return store.Volume{}, err
	}
	ctx = context.WithoutCancel(ctx)
	mk := m.makeImage
	if encrypt {
		mk = func(v store.Volume) error { return m.makeEncrypted(ctx, v) }
	}
	if err := mk(v); err != nil {
		return store.Volume{}, errors.Join(fmt.Errorf("create volume %s: %w", name, err), os.RemoveAll(m.namedDir(v.ID)), m.cfg.Store.DeleteVolume(ctx, v.ID))
	}
	if err := m.cfg.Store.SetVolumeState(ctx, v.ID, store.VolumeReady); err != nil {
		return store.Volume{}, errors.Join(err, os.RemoveAll(m.namedDir(v.ID)), m.cfg.Store.DeleteVolume(ctx, v.ID))
	}
	v.State = store.VolumeReady
	m.log.Info("volume created", "volume", v.ID, "name", name, "size_mib", size>>20, "encrypted", encrypt)
	return v, nil
}

// makeImage formats v's image and empties its root (mkfs's lost+found is
// not the user's).
func (m *Manager) makeImage(v store.Volume) error {
	if err := os.Mkdir(m.namedDir(v.ID), 0o700); err != nil {
		return err
	}
	img := m.namedImage(v.ID)
	if err := format(img, v.SizeBytes); err != nil {
		return err
	}
	return emptyRoot(img, m.mountPoint("init-"+v.ID))
}

// Get returns a volume by id or name. Errors: NotFound.
func (m *Manager) Get(ctx context.Context, ref string) (Info, error) {
	v, err := m.cfg.Store.GetVolume(ctx, ref)
	if err != nil {
		return Info{}, err
	}
	if v.State != store.VolumeReady {
		return Info{}, errdefs.New(errdefs.NotFound, "volume %s is %s", ref, v.State)
	}
	users, err := m.volumeUsers(ctx, v.ID)
	if err != nil {
		return Info{}, err
	}
	return m.info(v, users), nil
}

func (m *Manager) info(v store.Volume, users []string) Info {
	in := Info{Volume: v, Users: users}
	in.UsedBytes = diskUsage(m.namedData(v))
	m.mu.Lock()
	in.Mounted = len(m.users[m.mountPoint(namedKey(v.ID))]) > 0
	m.mu.Unlock()
	return in
}

// List returns every ready volume, by name.
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	vs, err := m.cfg.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	sbs, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, v := range vs {
		if v.State == store.VolumeReady {
			out = append(out, m.info(v, usersOf(v.ID, sbs)))
		}
	}
	return out, nil
}

// volumeUsers lists the sandboxes and snapshots that mount volume id itself.
func (m *Manager) volumeUsers(ctx context.Context, id string) ([]string, error) {
	sbs, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	return usersOf(id, sbs), nil
}

// usersOf returns the sandboxes of sbs that mount volume id itself: those
// made with it, and restored ones that share it.
func usersOf(id string, sbs []store.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		for _, vm := range sb.Opts.Volumes {
			if vm.Volume == id && !ownCopy(vm) {
				out = append(out, sb.ID)
				break
			}
		}
	}
	return out
}

// sharedBy returns the snapshots whose children would mount volume id
// itself (it was mounted shared).
func sharedBy(id string, snaps []store.Snapshot) []string {
	var out []string
	for _, sn := range snaps {
		for _, vm := range sn.Opts.Volumes {
			if vm.Volume == id && vm.Shared {
				out = append(out, sn.ID)
				break
			}
		}
	}
	return out
}

// Remove removes a volume nobody uses. Errors: NotFound; Conflict naming
// the sandboxes (and snapshots whose children would share it) that use it.
func (m *Manager) Remove(ctx context.Context, ref string) error {
	ctx = store.ForCleanup(ctx) // it frees space: see store.ForCleanup
	v, err := m.cfg.Store.GetVolume(ctx, ref)
	if err != nil {
		return err
	}
	// Checked and marked removing under mu: a sandbox mounting the volume
	// (use, also under mu) is either recorded before the check (a user) or
	// finds it removing.
	m.mu.Lock()
	err = m.checkUnused(ctx, ref, v)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if err := m.removeFiles(v.ID); err != nil {
		return err
	}
	if err := m.cfg.Store.DeleteVolume(context.WithoutCancel(ctx), v.ID); err != nil {
		return err
	}
	m.log.Info("volume removed", "volume", v.ID, "name", v.Name)
	return nil
}

// checkUnused refuses the removal of v while sandboxes or snapshots use it
// and marks it removing otherwise. Guarded by mu.
func (m *Manager) checkUnused(ctx context.Context, ref string, v store.Volume) error {
	users, err := m.volumeUsers(ctx, v.ID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return errdefs.New(errdefs.Conflict, "volume %s is in use by %d sandbox(es): %s; remove them first", ref, len(users), strings.Join(users, ", "))
	}
	snaps, err := m.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	if sn := sharedBy(v.ID, snaps); len(sn) > 0 {
		return errdefs.New(errdefs.Conflict, "volume %s is shared by the children of snapshot(s) %s; remove them first", ref, strings.Join(sn, ", "))
	}
	return m.cfg.Store.SetVolumeState(context.WithoutCancel(ctx), v.ID, store.VolumeRemoving)
}

// removeFiles unmounts and deletes a named volume's files.
func (m *Manager) removeFiles(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, key := range []string{namedKey(id), "init-" + id} {
		mnt := m.mountPoint(key)
		if err := unmount(mnt); err != nil {
			return err
		}
		if err := os.Remove(mnt); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := closeView(mnt); err != nil {
			return err
		}
		delete(m.users, mnt)
	}
	return os.RemoveAll(m.namedDir(id))
}

// Resolve checks the volumes a new sandbox asks for and fills in each
// volume's id. Errors: InvalidArgument, NotFound.
func (m *Manager) Resolve(ctx context.Context, vms []store.VolumeMount) error {
	if len(vms) > MaxMounts {
		return errdefs.New(errdefs.InvalidArgument, "%d volumes: at most %d per sandbox", len(vms), MaxMounts)
	}
	seen := map[string]bool{}
	for i := range vms {
		vm := &vms[i]
		if vm.Clone != "" {
			return errdefs.New(errdefs.InvalidArgument, "volume %s: clone is set by the daemon", vm.Name)
		}
		if err := ValidName(vm.Name); err != nil {
			return err
		}
		if err := ValidPath(vm.Path); err != nil {
			return err
		}
		for p := range seen {
			if p == vm.Path || strings.HasPrefix(p, vm.Path+"/") || strings.HasPrefix(vm.Path, p+"/") {
				return errdefs.New(errdefs.InvalidArgument, "volume paths %s and %s overlap: give each volume its own path", p, vm.Path)
			}
		}
		seen[vm.Path] = true
		v, err := m.cfg.Store.GetVolume(ctx, vm.Name)
		if errdefs.IsNotFound(err) || (err == nil && v.State != store.VolumeReady) {
			return errdefs.New(errdefs.NotFound, "no volume %q: make it with `clade volume create %s`", vm.Name, vm.Name)
		}
		if err != nil {
			return err
		}
		vm.Volume, vm.Name, vm.Key = v.ID, v.Name, v.Key
	}
	return nil
}

// ownCopy reports whether a sandbox mounts its own copy for vm rather than
// the named volume.
func ownCopy(vm store.VolumeMount) bool { return vm.Clone != "" && !vm.Shared }

func namedKey(id string) string { return "v-" + id }

// namedData is where a named volume's bytes are: its image, or the
// gocryptfs directory holding it.
func (m *Manager) namedData(v store.Volume) string {
	if v.Encrypted() {
		return filepath.Join(m.namedDir(v.ID), cryptDir)
	}
	return m.namedImage(v.ID)
}

// source is the data (an image, or an encrypted volume's directory) and
// mount point of a sandbox's i-th mount.
func (m *Manager) source(sandboxID string, i int, vm store.VolumeMount) (data, mnt string) {
	if ownCopy(vm) {
		return m.ownImage(sandboxID, i, vm), m.mountPoint("s-" + sandboxID + "-" + strconv.Itoa(i))
	}
	return m.namedData(store.Volume{ID: vm.Volume, Key: vm.Key}), m.mountPoint(namedKey(vm.Volume))
}

// dataExt is the suffix of a copy's data: an image or a directory.
func dataExt(vm store.VolumeMount) string {
	if len(vm.Key) > 0 {
		return ".crypt"
	}
	return ".img"
}

func (m *Manager) ownImage(sandboxID string, i int, vm store.VolumeMount) string {
	return filepath.Join(m.cfg.Dir, "sandboxes", sandboxID, strconv.Itoa(i)+dataExt(vm))
}

func (m *Manager) snapshotImage(snapshotID string, i int, vm store.VolumeMount) string {
	return filepath.Join(m.cfg.Dir, "snapshots", snapshotID, strconv.Itoa(i)+dataExt(vm))
}
