package secret

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/guest"
	"github.com/clade-sandbox/clade/internal/store"
)

// MaxValue bounds a secret's value.
const MaxValue = api.MaxSecretBytes

// FileDir is the in-sandbox tmpfs secret files are written to.
const FileDir = "/run/secrets"

// Config configures a Manager.
type Config struct {
	Store Store
	Key   *Key
	Log   *slog.Logger
}

// Store is what secrets need of the store: their own records, and the
// sandboxes' and snapshots' (which secrets they hold).
type Store interface {
	store.Secrets
	ListSandboxes(ctx context.Context) ([]store.Sandbox, error)
	ListSnapshots(ctx context.Context) ([]store.Snapshot, error)
}

// Manager sets, lists and removes secrets, and (as a sandbox Hook) puts
// them into the sandboxes that ask for them.
type Manager struct {
	cfg Config
	log *slog.Logger
}

// keyCheckText is sealed once per data dir, so that a daemon started with
// another key fails at start instead of at the first sandbox.
const keyCheckText = "clade host key check"

// Open loads the host key for the data dir of st (see LoadKey; the key
// file is made only for a data dir that has sealed nothing yet) and
// returns a Manager once the key proves to be the one its secrets were
// sealed with. A wrong or missing key is an error that says what to do,
// and nothing is changed or deleted.
func Open(ctx context.Context, st Store, keyFile, keyEnv string, log *slog.Logger) (*Manager, error) {
	kc, err := st.KeyCheck(ctx)
	if err != nil {
		return nil, err
	}
	key, err := LoadKey(keyFile, keyEnv, kc == nil)
	if err != nil {
		return nil, err
	}
	return New(ctx, Config{Store: st, Key: key, Log: log})
}

// New checks that the key opens this data dir's secrets (recording a check
// value the first time). A wrong key is an error that says what to do and
// changes nothing.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, log: cfg.Log}
	kc, err := cfg.Store.KeyCheck(ctx)
	if err != nil {
		return nil, err
	}
	if kc == nil {
		return m, cfg.Store.SetKeyCheck(ctx, cfg.Key.Seal([]byte(keyCheckText), []byte("key-check")))
	}
	if b, err := cfg.Key.Open(kc, []byte("key-check")); err != nil || string(b) != keyCheckText {
		return nil, errdefs.New(errdefs.InvalidArgument, "the key from %s is not the key this data dir's secrets were sealed with: start the daemon with that key (--key-file or its environment variable); nothing was changed or deleted", cfg.Key.Source)
	}
	return m, nil
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidName checks a secret name.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.InvalidArgument, "bad secret name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", name)
	}
	return nil
}

func ad(name string, version int) []byte {
	return fmt.Appendf(nil, "secret\x00%s\x00%d", name, version)
}

// Set stores a new version of secret name: sandboxes made from now on get
// it, running ones keep the version they have. Errors: InvalidArgument.
func (m *Manager) Set(ctx context.Context, name string, value []byte) (store.Secret, error) {
	if err := ValidName(name); err != nil {
		return store.Secret{}, err
	}
	if len(value) > MaxValue {
		return store.Secret{}, errdefs.New(errdefs.InvalidArgument, "secret %s is %d bytes: at most %d", name, len(value), MaxValue)
	}
	sc, err := m.cfg.Store.PutSecret(ctx, name, func(v int) []byte { return m.cfg.Key.Seal(value, ad(name, v)) })
	if err != nil {
		return store.Secret{}, err
	}
	m.prune(ctx, name)
	m.log.Info("secret set", "secret", name, "version", sc.Version)
	return sc, nil
}

// Info is a secret with the sandboxes that use it.
type Info struct {
	store.Secret
	Users []string
}

// List returns every secret's name, version and dates; never a value.
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	scs, err := m.cfg.Store.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	sbs, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, sc := range scs {
		out = append(out, Info{Secret: sc, Users: users(sc.Name, sbs)})
	}
	return out, nil
}

func users(name string, sbs []store.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		for _, r := range sb.Opts.Secrets {
			if r.Name == name {
				out = append(out, sb.ID)
				break
			}
		}
	}
	return out
}

// Remove deletes a secret no sandbox uses. Errors: NotFound; Conflict
// naming the sandboxes that use it.
func (m *Manager) Remove(ctx context.Context, name string) error {
	if _, err := m.cfg.Store.GetSecret(ctx, name); err != nil {
		return err
	}
	sbs, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	if u := users(name, sbs); len(u) > 0 {
		return errdefs.New(errdefs.Conflict, "secret %s is in use by %d sandbox(es): %s; remove them first", name, len(u), strings.Join(u, ", "))
	}
	snaps, err := m.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		for _, r := range sn.Opts.Secrets {
			if r.Name == name {
				return errdefs.New(errdefs.Conflict, "secret %s is taken by the children of snapshot %s; remove it first", name, sn.ID)
			}
		}
	}
	if err := m.cfg.Store.DeleteSecret(ctx, name); err != nil {
		return err
	}
	m.log.Info("secret removed", "secret", name)
	return nil
}

// prune deletes the versions of name older than the current one that no
// sandbox or snapshot records.
func (m *Manager) prune(ctx context.Context, name string) {
	keep := map[int]bool{}
	sbs, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return
	}
	snaps, err := m.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return
	}
	var refs []store.SecretRef
	for _, sb := range sbs {
		refs = append(refs, sb.Opts.Secrets...)
	}
	for _, sn := range snaps {
		refs = append(refs, sn.Opts.Secrets...)
	}
	for _, r := range refs {
		if r.Name == name {
			keep[r.Version] = true
		}
	}
	if err := m.cfg.Store.PruneSecretVersions(ctx, name, keep); err != nil {
		m.log.Warn("prune old secret versions", "secret", name, "err", err)
	}
}

// value opens the version of a secret a sandbox took.
func (m *Manager) value(ctx context.Context, r store.SecretRef) ([]byte, error) {
	sealed, err := m.cfg.Store.SecretValue(ctx, r.Name, r.Version)
	if err != nil {
		return nil, err
	}
	v, err := m.cfg.Key.Open(sealed, ad(r.Name, r.Version))
	if err != nil {
		return nil, fmt.Errorf("secret %s version %d: %w", r.Name, r.Version, err)
	}
	return v, nil
}

// Key returns the host key.
func (m *Manager) Key() *Key { return m.cfg.Key }

// Name implements sandbox.Hook.
func (m *Manager) Name() string { return "secrets" }

// CompleteCreate checks the secrets a new sandbox asks for and pins each to
// its current version. Without an env or a file, a secret goes into the
// environment variable of its name.
func (m *Manager) CompleteCreate(o *store.Options) error {
	if len(o.Secrets) > 64 {
		return errdefs.New(errdefs.InvalidArgument, "%d secrets: at most 64 per sandbox", len(o.Secrets))
	}
	envs, files := map[string]bool{}, map[string]bool{}
	for i := range o.Secrets {
		r := &o.Secrets[i]
		if err := ValidName(r.Name); err != nil {
			return err
		}
		if r.Env != "" && r.File != "" {
			return errdefs.New(errdefs.InvalidArgument, "secret %s: give an env or a file, not both (list the secret twice for both)", r.Name)
		}
		if r.Env == "" && r.File == "" {
			r.Env = envName(r.Name)
		}
		if r.Env != "" {
			if !envRE.MatchString(r.Env) || strings.HasPrefix(r.Env, "CLADE_") {
				return errdefs.New(errdefs.InvalidArgument, "secret %s: bad environment variable name %q: use letters, digits and '_', not starting with a digit or CLADE_", r.Name, r.Env)
			}
			if envs[r.Env] {
				return errdefs.New(errdefs.InvalidArgument, "two secrets go into $%s", r.Env)
			}
			envs[r.Env] = true
		}
		if r.File != "" {
			if path.Clean(r.File) != r.File || path.Dir(r.File) != FileDir || !nameRE.MatchString(path.Base(r.File)) {
				return errdefs.New(errdefs.InvalidArgument, "secret %s: file %q must be %s/NAME (a tmpfs inside the sandbox)", r.Name, r.File, FileDir)
			}
			if files[r.File] {
				return errdefs.New(errdefs.InvalidArgument, "two secrets go into %s", r.File)
			}
			files[r.File] = true
		}
		sc, err := m.cfg.Store.GetSecret(context.Background(), r.Name)
		if err != nil {
			return err
		}
		r.Version = sc.Version
		if r.Env != "" {
			// Checked before anything starts: no process could start
			// with it in its environment.
			v, err := m.value(context.Background(), *r)
			if err != nil {
				return err
			}
			if bytes.IndexByte(v, 0) >= 0 {
				return errdefs.New(errdefs.InvalidArgument, "secret %s holds a NUL byte, which an environment variable cannot: give it with --secret-file instead", r.Name)
			}
		}
	}
	return nil
}

// BeforeStart adds the tmpfs rec's secret files go to. Environment
// secrets are not in spec: the engine would write them into its files on
// the host (runsc's bundle and state); AfterStart hands them to the agent
// instead, which holds them in memory.
func (m *Manager) BeforeStart(ctx context.Context, rec store.Sandbox, spec *engine.Spec) error {
	for _, r := range rec.Opts.Secrets {
		if r.File != "" {
			spec.Mounts = append(spec.Mounts, engine.Mount{Type: engine.MountTmpfs, Destination: FileDir})
			break
		}
	}
	return nil
}

// AfterStart gives a sandbox booted from its image (or claimed from the
// hot pool) its secrets: the environment ones to its agent's memory, the
// file ones onto its tmpfs. Restored and woken sandboxes have both in
// their memory already (their checkpoint holds them).
func (m *Manager) AfterStart(ctx context.Context, rec store.Sandbox, sb engine.Sandbox) error {
	if rec.State != store.StateCreating || rec.Snapshot != "" || len(rec.Opts.Secrets) == 0 {
		return nil
	}
	var env []string
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	n := 0
	for _, r := range rec.Opts.Secrets {
		v, err := m.value(ctx, r)
		if err != nil {
			return err
		}
		if r.File == "" {
			if bytes.IndexByte(v, 0) >= 0 {
				// No process could start with it in its environment.
				return errdefs.New(errdefs.InvalidArgument, "secret %s holds a NUL byte, which an environment variable cannot: give it with --secret-file instead", r.Name)
			}
			env = append(env, r.Env+"="+string(v))
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: path.Base(r.File), Mode: 0o400, Size: int64(len(v)), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(v); err != nil {
			return err
		}
		n++
	}
	if len(env) > 0 {
		if err := sb.Guest().Reconfigure(ctx, guest.Config{SecretEnv: env}); err != nil {
			return errors.New("give the sandbox its secret environment: " + err.Error())
		}
	}
	if n == 0 {
		return nil
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := sb.Guest().CopyIn(ctx, FileDir, &buf); err != nil {
		return errors.New("write secret files into the sandbox: " + err.Error())
	}
	return nil
}

// AfterStop implements sandbox.Hook.
func (m *Manager) AfterStop(context.Context, store.Sandbox) error { return nil }

// AfterRemove lets old versions of rec's secrets go once nobody has them.
func (m *Manager) AfterRemove(ctx context.Context, rec store.Sandbox) error {
	for _, r := range rec.Opts.Secrets {
		m.prune(ctx, r.Name)
	}
	return nil
}

// Reconcile implements sandbox.Hook.
func (m *Manager) Reconcile(context.Context, []store.Sandbox, []store.Sandbox) error { return nil }

// envName is the default environment variable of secret name.
func envName(name string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '.' {
			return '_'
		}
		return r
	}, strings.ToUpper(name))
}
