package volume

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/atrest"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
	"golang.org/x/sys/unix"
)

// Encrypted volumes (volume create --encrypt) have a key of their own: 32
// random bytes, sealed under the host key in the volume's store record
// (never on disk in plaintext). The volume's image lives in a gocryptfs
// directory opened with that key (package atrest), so the directory is
// ciphertext only, its file names included:
//
//	named/<id>/crypt/            gocryptfs.conf, gocryptfs.diriv, the encrypted image
//	mnt/c<key>                   its plain view while the volume is mounted: disk.img
//	mnt/<key>                    disk.img loop-mounted, as for a plain volume
//
// The view is mounted only while a sandbox uses the volume. Copies for
// snapshots and fork children are copies of the directory (a reflink where
// the file system has them): the same key opens them; each copy's record
// carries that key, sealed, so it outlives the named volume's removal.
// Export writes the directory as a tar (ciphertext only) and hands out the
// key once; import checks that the key opens it before anything is kept.

// Sealer seals values under the host key (*secret.Key).
type Sealer interface {
	Seal(plaintext, ad []byte) []byte
	Open(sealed, ad []byte) ([]byte, error)
}

// KeySize is an encrypted volume's key length.
const KeySize = 32

func keyAD(volumeID string) []byte { return []byte("volume-key\x00" + volumeID) }

// cryptDir is the gocryptfs directory of an encrypted image store.
const cryptDir = "crypt"

// viewOf is where the plain view behind loop mount mnt is mounted.
func viewOf(mnt string) string { return filepath.Join(filepath.Dir(mnt), "c"+filepath.Base(mnt)) }

// parseKey decodes a volume key given by a user: hex of KeySize bytes.
func parseKey(key string) ([]byte, error) {
	raw, err := hex.DecodeString(strings.TrimSpace(key))
	if err != nil || len(raw) != KeySize {
		return nil, errdefs.New(errdefs.InvalidArgument, "the volume key must be hex of %d bytes (as `clade volume export --key-file` writes it; make one with `head -c 32 /dev/urandom | xxd -p -c 64`)", KeySize)
	}
	return raw, nil
}

// newKey makes an encrypted volume's key and seals it for volume id.
func (m *Manager) newKey(id string) (raw, sealed []byte, err error) {
	if m.cfg.Sealer == nil {
		return nil, nil, errdefs.New(errdefs.InvalidArgument, "this daemon has no host key to seal volume keys with")
	}
	raw = make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return nil, nil, err
	}
	return raw, m.cfg.Sealer.Seal(raw, keyAD(id)), nil
}

// openKey unseals the key of an encrypted volume (or a copy of one).
func (m *Manager) openKey(volumeID string, sealed []byte) (string, error) {
	if m.cfg.Sealer == nil {
		return "", errdefs.New(errdefs.InvalidArgument, "this daemon has no host key to open volume keys with")
	}
	raw, err := m.cfg.Sealer.Open(sealed, keyAD(volumeID))
	if err != nil {
		return "", fmt.Errorf("volume %s's key: %w", volumeID, err)
	}
	return hex.EncodeToString(raw), nil
}

// openView mounts the plain view of cipher dir for loop mount mnt and
// returns the image in it.
func (m *Manager) openView(ctx context.Context, volumeID string, sealed []byte, cipher, mnt string) (string, error) {
	key, err := m.openKey(volumeID, sealed)
	if err != nil {
		return "", err
	}
	fs, err := atrest.OpenDir(ctx, cipher, viewOf(mnt), key)
	if errors.Is(err, atrest.ErrWrongKey) {
		return "", fmt.Errorf("volume %s: %w (%s)", volumeID, err, cipher)
	}
	if err != nil {
		return "", err
	}
	return filepath.Join(fs.Plain, "disk.img"), nil
}

// closeView unmounts the plain view behind loop mount mnt, if any.
func closeView(mnt string) error {
	v := viewOf(mnt)
	if _, err := os.Lstat(v); os.IsNotExist(err) {
		return nil // a plain volume's, or closed already
	}
	if err := atrest.UnmountDir(v); err != nil {
		return err
	}
	if err := os.Remove(v); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// makeEncrypted makes v's gocryptfs directory and, in it, its image.
func (m *Manager) makeEncrypted(ctx context.Context, v store.Volume) error {
	if err := os.Mkdir(m.namedDir(v.ID), 0o700); err != nil {
		return err
	}
	cipher := filepath.Join(m.namedDir(v.ID), cryptDir)
	key, err := m.openKey(v.ID, v.Key)
	if err != nil {
		return err
	}
	if err := atrest.InitDir(ctx, cipher, key); err != nil {
		return err
	}
	mnt := m.mountPoint("init-" + v.ID)
	img, err := m.openView(ctx, v.ID, v.Key, cipher, mnt)
	if err != nil {
		return err
	}
	err = format(img, v.SizeBytes)
	if err == nil {
		err = emptyRoot(img, mnt)
	}
	if err = errors.Join(err, closeView(mnt)); err != nil {
		return err
	}
	return reserveCipher(cipher)
}

// reserveCipher reserves the room of the encrypted image in gocryptfs dir
// cipher, as reserve does a plain image's: through the view the image
// stays sparse (FUSE), so the ciphertext file's holes are allocated as
// unwritten extents. They read as zeros, which gocryptfs reads as holes:
// the plain bytes are the same. Not in a FUSE dir (--encrypt-at-rest).
func reserveCipher(cipher string) error {
	ents, err := os.ReadDir(cipher)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == "gocryptfs.conf" || e.Name() == "gocryptfs.diriv" || !e.Type().IsRegular() {
			continue
		}
		if err := reserve(filepath.Join(cipher, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// emptyRoot removes mkfs's lost+found from the new image img.
func emptyRoot(img, mnt string) error {
	if err := mountImage(img, mnt, false); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(mnt, "lost+found"))
	if err == nil {
		err = os.Chmod(mnt, 0o755)
	}
	return errors.Join(err, unmount(mnt), os.Remove(mnt))
}

// cloneData copies an image file, or an encrypted volume's directory file
// by file, to dst (which must not exist); on error dst does not exist.
func cloneData(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		_, err := cloneFile(src, dst)
		return err
	}
	tmp := dst + ".tmp"
	_ = os.RemoveAll(tmp) // a killed daemon's half copy
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err == nil {
		for _, e := range ents {
			if !e.Type().IsRegular() {
				err = fmt.Errorf("%s: %s is not a regular file", src, e.Name())
				break
			}
			if _, err = cloneFile(filepath.Join(src, e.Name()), filepath.Join(tmp, e.Name())); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		return errors.Join(err, os.RemoveAll(tmp))
	}
	return nil
}

// diskUsage is what a file or a directory's files take on disk.
func diskUsage(p string) int64 {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return 0
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return st.Blocks * 512
	}
	var n int64
	ents, _ := os.ReadDir(p)
	for _, e := range ents {
		if unix.Stat(filepath.Join(p, e.Name()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// Export writes encrypted volume ref as a tar of its gocryptfs directory
// (ciphertext and gocryptfs's config only) to w, and returns the volume's
// key (hex) that opens it: `clade volume import` on another host takes
// both. A volume in use is copied with its file system frozen, as a
// snapshot copies it. Errors: NotFound; InvalidArgument for a plain volume.
func (m *Manager) Export(ctx context.Context, ref string, w io.Writer) error {
	v, err := m.cfg.Store.GetVolume(ctx, ref)
	if err != nil {
		return err
	}
	if v.State != store.VolumeReady {
		return errdefs.New(errdefs.NotFound, "volume %s is %s", ref, v.State)
	}
	if !v.Encrypted() {
		return errdefs.New(errdefs.InvalidArgument, "volume %s is not encrypted: only volumes made with `clade volume create --encrypt` can be exported", v.Name)
	}
	tmp, err := os.MkdirTemp(filepath.Join(m.cfg.Dir, "tmp"), "export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, cryptDir)
	if err := m.copyFrozen(filepath.Join(m.namedDir(v.ID), cryptDir), m.mountPoint(namedKey(v.ID)), dst); err != nil {
		return fmt.Errorf("export volume %s: %w", v.Name, err)
	}
	ents, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range ents {
		if err := addFile(tw, filepath.Join(dst, e.Name())); err != nil {
			return fmt.Errorf("export volume %s: %w", v.Name, err)
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.Base(p), Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// Key returns encrypted volume ref's key, hex. Errors: NotFound;
// InvalidArgument for a plain volume.
func (m *Manager) Key(ctx context.Context, ref string) (string, error) {
	v, err := m.cfg.Store.GetVolume(ctx, ref)
	if err != nil {
		return "", err
	}
	if v.State != store.VolumeReady {
		return "", errdefs.New(errdefs.NotFound, "volume %s is %s", ref, v.State)
	}
	if !v.Encrypted() {
		return "", errdefs.New(errdefs.InvalidArgument, "volume %s is not encrypted: it has no key of its own", v.Name)
	}
	return m.openKey(v.ID, v.Key)
}

// cipherName is what gocryptfs's encrypted file names look like (base64url
// of the encrypted name; longer names are gocryptfs.longname.*, which a
// volume's one file, disk.img, never needs).
var cipherName = regexp.MustCompile(`^[A-Za-z0-9_-]{22,255}$`)

// exportFlags are the gocryptfs feature flags an imported volume's config
// may have: those of gocryptfs -init (with -aessiv or -xchacha on other
// hosts' defaults).
var exportFlags = map[string]bool{
	"HKDF": true, "GCMIV128": true, "DirIV": true, "EMENames": true, "LongNames": true,
	"Raw64": true, "AESSIV": true, "XChaCha20Poly1305": true,
}

// importMaxFile bounds the encrypted image's size: the largest volume plus
// gocryptfs's overhead (a header and 32 bytes per 4 KiB block).
const importMaxFile = MaxSize + MaxSize/128 + 1<<20

// Import makes volume name of an export read from r (a tar Export wrote)
// and key (hex of 32 bytes, as Export's host handed it out). The key is
// checked to open the directory, and the image in it to be an ext4 file
// system of a volume's size, before the volume is kept; on any error
// nothing is left and nothing else is touched. Errors: InvalidArgument
// (a bad name, key, archive, or a key that does not open it),
// AlreadyExists, ResourceExhausted.
func (m *Manager) Import(ctx context.Context, name string, r io.Reader, key string) (store.Volume, error) {
	if err := ValidName(name); err != nil {
		return store.Volume{}, err
	}
	raw, err := parseKey(key)
	if err != nil {
		return store.Volume{}, err
	}
	if m.cfg.Sealer == nil {
		return store.Volume{}, errdefs.New(errdefs.InvalidArgument, "this daemon has no host key to seal volume keys with")
	}
	v := store.Volume{ID: newID(), Name: name, State: store.VolumeCreating}
	v.Key = m.cfg.Sealer.Seal(raw, keyAD(v.ID))
	if err := m.cfg.Store.InsertVolume(ctx, v); err != nil {
		return store.Volume{}, err
	}
	ctx = context.WithoutCancel(ctx)
	size, err := m.importFiles(ctx, v, r)
	if err != nil {
		return store.Volume{}, errors.Join(err, m.removeFiles(v.ID), m.cfg.Store.DeleteVolume(ctx, v.ID))
	}
	v.SizeBytes = size
	if err := m.cfg.Store.SetVolumeImported(ctx, v.ID, size); err != nil {
		return store.Volume{}, errors.Join(err, m.removeFiles(v.ID), m.cfg.Store.DeleteVolume(ctx, v.ID))
	}
	v.State = store.VolumeReady
	m.log.Info("volume imported", "volume", v.ID, "name", name, "size_mib", size>>20)
	return v, nil
}

// importFiles unpacks r into v's directory and checks it; it returns the
// volume's size.
func (m *Manager) importFiles(ctx context.Context, v store.Volume, r io.Reader) (int64, error) {
	cipher := filepath.Join(m.namedDir(v.ID), cryptDir)
	if err := os.MkdirAll(cipher, 0o700); err != nil {
		return 0, err
	}
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.InvalidArgument, "not a clade volume export: "+format+"; nothing was imported", args...)
	}
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	images := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, bad("%v", err)
		}
		switch {
		case h.Typeflag != tar.TypeReg:
			return 0, bad("%q is not a regular file", h.Name)
		case seen[h.Name]:
			return 0, bad("%q is there twice", h.Name)
		case h.Name == "gocryptfs.conf" || h.Name == "gocryptfs.diriv":
			if h.Size > 64<<10 {
				return 0, bad("%s has %d bytes", h.Name, h.Size)
			}
		case cipherName.MatchString(h.Name):
			if images++; images > 1 {
				return 0, bad("more than one image")
			}
			if h.Size > importMaxFile {
				return 0, bad("an image of %d bytes is larger than the largest volume", h.Size)
			}
		default:
			return 0, bad("unexpected entry %q", h.Name)
		}
		seen[h.Name] = true
		var fs unix.Statfs_t
		if err := unix.Statfs(cipher, &fs); err == nil && int64(fs.Bavail)*fs.Bsize < h.Size {
			return 0, errdefs.New(errdefs.ResourceExhausted, "the volume's %d MiB do not fit: the host has %d MiB free; nothing was imported", h.Size>>20, int64(fs.Bavail)*fs.Bsize>>20)
		}
		if err := writeSparse(filepath.Join(cipher, h.Name), tr, h.Size); err != nil {
			return 0, bad("%s: %v", h.Name, err)
		}
	}
	if !seen["gocryptfs.conf"] || !seen["gocryptfs.diriv"] || images != 1 {
		return 0, bad("it needs gocryptfs.conf, gocryptfs.diriv and one image")
	}
	// The config is the exporter's: a huge scrypt cost would make gocryptfs
	// take the host's memory before it finds out whether the key opens it.
	var conf struct {
		ScryptObject struct{ N, R, P int64 }
		Version      int
		FeatureFlags []string
	}
	if b, err := os.ReadFile(filepath.Join(cipher, "gocryptfs.conf")); err != nil || json.Unmarshal(b, &conf) != nil {
		return 0, bad("gocryptfs.conf does not parse")
	}
	if sc := conf.ScryptObject; sc.N < 2 || sc.N > 1<<17 || sc.R < 1 || sc.R > 16 || sc.P < 1 || sc.P > 4 {
		return 0, bad("gocryptfs.conf asks for a scrypt cost of N=%d r=%d p=%d (at most 2^17, 16, 4)", sc.N, sc.R, sc.P)
	}
	// Only the format gocryptfs -init makes for clade: no FIDO2 token, no
	// plaintext names, nothing this host's gocryptfs would fail on with an
	// error of its own.
	if conf.Version != 2 {
		return 0, bad("gocryptfs.conf is of on-disk format %d (clade makes 2)", conf.Version)
	}
	for _, f := range conf.FeatureFlags {
		if !exportFlags[f] {
			return 0, bad("gocryptfs.conf has feature flag %q, which clade volumes do not use", f)
		}
	}
	mnt := m.mountPoint("init-" + v.ID)
	img, err := m.openView(ctx, v.ID, v.Key, cipher, mnt)
	if err != nil {
		if errors.Is(err, atrest.ErrWrongKey) {
			return 0, errdefs.New(errdefs.InvalidArgument, "the key does not open this volume export: pass the key file written with it by `clade volume export --key-file`; nothing was imported")
		}
		// What else gocryptfs refuses is the export's fault: say so
		// without the host's paths.
		return 0, bad("gocryptfs does not open it: %s", strings.ReplaceAll(err.Error(), cipher, "the export"))
	}
	size, err := checkImage(ctx, img)
	if err = errors.Join(err, closeView(mnt)); err != nil {
		return 0, err
	}
	return size, reserveCipher(cipher)
}

// checkImage checks that the view holds only disk.img, an ext4 file
// system of a volume's size, and returns the size.
func checkImage(ctx context.Context, img string) (int64, error) {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.InvalidArgument, "not a clade volume export: "+format+"; nothing was imported", args...)
	}
	ents, err := os.ReadDir(filepath.Dir(img))
	if err != nil {
		return 0, err
	}
	if len(ents) != 1 || ents[0].Name() != filepath.Base(img) || !ents[0].Type().IsRegular() {
		return 0, bad("it holds something other than one disk.img")
	}
	fi, err := os.Stat(img)
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size < MinSize || size > MaxSize || size%4096 != 0 {
		return 0, bad("an image of %d bytes is not a volume's size", size)
	}
	// The image is about to be mounted by the host's kernel: check it is a
	// sound ext4 first (read-only, -n). e2fsck -n skips a journal that
	// needs recovery and passes the file system, but the kernel replays it
	// at mount: blocks nobody checked would then be written over checked
	// metadata. An external journal would have the kernel open a host
	// block device. A clade export has neither (a frozen ext4 has a
	// flushed journal), so both are refused.
	if err := checkSuperblock(img); err != nil {
		return 0, bad("%v", err)
	}
	if err := fsck(ctx, img, fsckTimeout(size)); err != nil {
		return 0, bad("%v", err)
	}
	return size, nil
}

// fsckTimeout bounds e2fsck's check of an imported image of size bytes:
// a hostile image could make it run (or hang) for ever. A clade export's
// image checks in well under a second per GiB here; the bound is
// generous: 2 minutes and 2 s per GiB.
var fsckTimeout = func(size int64) time.Duration { return 2*time.Minute + time.Duration(size>>30)*2*time.Second }

// fsck runs e2fsck -n -f on img, killed (with whatever it started) once
// timeout has passed.
func fsck(ctx context.Context, img string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "e2fsck", "-n", "-f", img)
	// In a process group of its own, which the deadline kills whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("e2fsck did not finish checking its image within %s (a damaged or hostile image)", timeout)
	case err != nil:
		return fmt.Errorf("its image is not a sound ext4 file system: %v: %s", err, lastLine(string(out)))
	}
	return nil
}

// ext4 superblock fields (offsets in the superblock, at byte 1024).
const (
	sbMagic            = 0x38
	sbFeatureIncompat  = 0x60
	sbJournalDev       = 0xE4
	ext4Magic          = 0xEF53
	incompatRecover    = 0x4 // the journal needs recovery
	incompatJournalDev = 0x8 // this is an external journal device
)

// checkSuperblock refuses an ext4 image whose mount would replay a
// journal or use a journal outside the image.
func checkSuperblock(img string) error {
	f, err := os.Open(img)
	if err != nil {
		return err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return fmt.Errorf("its image has no ext4 superblock: %v", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[sbMagic:]) != ext4Magic {
		return errors.New("its image is not an ext4 file system")
	}
	incompat := le.Uint32(sb[sbFeatureIncompat:])
	if incompat&incompatRecover != 0 {
		return errors.New("its image's journal needs recovery (the file system was not cleanly unmounted or frozen)")
	}
	if incompat&incompatJournalDev != 0 || le.Uint32(sb[sbJournalDev:]) != 0 {
		return errors.New("its image uses an external journal")
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// writeSparse writes n bytes of r to a new file at p, leaving all-zero
// 4 KiB blocks as holes (an export streams a sparse image's holes as
// zeros; gocryptfs reads a hole as zeros, so the bytes are the same).
func writeSparse(p string, r io.Reader, n int64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for off < n {
		c, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-off)])
		if err != nil {
			f.Close()
			return fmt.Errorf("truncated: %w", err)
		}
		for b := 0; b < c; b += 4096 {
			blk := buf[b:min(b+4096, c)]
			if allZero(blk) {
				continue
			}
			if _, err := f.WriteAt(blk, off+int64(b)); err != nil {
				f.Close()
				return err
			}
		}
		off += int64(c)
	}
	err = f.Truncate(n)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
