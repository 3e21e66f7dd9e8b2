package system

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/atrest"
	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/deadpeer"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/httpapi"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/service/local"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/volume"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Options configures a whole daemon.
type Options struct {
	Version string
	DataDir string
	// ImagesDir defaults to DataDir/images.
	ImagesDir string
	Socket    string
	// Listen, when set, also serves TCP; it requires Token.
	Listen string
	Token  string
	// Ingress, when set, serves the ingress proxy on this TCP address:
	// Host PORT-ID.IngressDomain reaches that port inside the sandbox.
	Ingress       string
	IngressDomain string
	// IngressTLS serves the ingress over TLS (HTTP/2 and HTTP/1.1) with
	// IngressTLSCert and IngressTLSKey (PEM files), or without them with
	// a certificate of the daemon's own CA, made once in DataDir
	// (ingress.LoadCA). A cert and key turn TLS on by themselves.
	IngressTLS                    bool
	IngressTLSCert, IngressTLSKey string
	// IngressDNS, when set, serves DNS on this address (UDP and TCP):
	// IngressDomain and every name under it resolve to the ingress's
	// address; every other name is refused (ingress.DNS).
	IngressDNS string
	// IngressLimits are the ingress proxy's time and connection limits
	// (its Domain and Log are set from the fields above).
	IngressLimits ingress.Config
	// E2B, when set, serves the E2B API (REST and envd) on this TCP
	// address; it requires Token, which clients send as E2B_API_KEY.
	E2B string
	// Code configures the proxy to sandboxes' code interpreters (its
	// answer wait).
	Code codeint.Config
	// E2BBaseImage is the image E2B's `base` template runs on (see
	// e2b.Config.BaseImage); a built-in one is built at start after the
	// default image when the E2B front is on.
	E2BBaseImage string
	// Engine names the engine that runs sandboxes (see Engines).
	Engine    string
	Runsc     string
	AgentPath string
	// QEMUTCGCacheMiB is each qemu VM's TCG translation cache
	// (qemu.Config.TCGCacheMiB; 0 the engine's default).
	QEMUTCGCacheMiB int
	// QEMU is the qemu-system-x86_64 binary (empty: from $PATH) and
	// QEMUKernelDir the guest kernel's directory (empty: qemu's default).
	QEMU, QEMUKernelDir string
	// BuildDefaultImage builds the default image at start if it is missing.
	BuildDefaultImage bool
	Sandbox           sandbox.Config
	// DefaultNetwork is the network mode of sandboxes that ask for none:
	// "internet" (the default when empty) or "none". Network configures the
	// sandbox networks (its StateDir and Log are set here).
	DefaultNetwork string
	Network        network.Config
	Log            *slog.Logger
	// KeyFile holds the host key that seals secrets (default
	// DATA-DIR/host.key, made 0600 at the first start); KeyEnv names an
	// environment variable that holds the key instead, for hosts that keep
	// it off the disk.
	KeyFile string
	KeyEnv  string
	// EncryptAtRest keeps snapshots, sleep images, volumes and sandbox
	// upper layers in an encrypted directory (package atrest).
	EncryptAtRest bool
	// ObjectStore, when set, is where sleep images and snapshots are
	// copied once sealed (s3://BUCKET?endpoint=URL or a directory), and
	// fetched back from when their local copy is gone.
	ObjectStore string
	// ObjectStoreCredentials is a file of AWS_ACCESS_KEY_ID= and
	// AWS_SECRET_ACCESS_KEY= lines; else those environment variables.
	ObjectStoreCredentials string
	// upperRoot is where the engine keeps upper layers ("" its default).
	upperRoot string
	// Cluster, when its Etcd is set, makes the daemon a node of a
	// cluster (package cluster); else it is a daemon of its own.
	Cluster ClusterOptions
	// Ready, if set, is called once the daemon serves.
	Ready func()
}

// Run starts a daemon and serves until ctx ends. Sandboxes keep running
// after it returns; the next daemon on the same data dir reattaches to them.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.DataDir == "" {
		return errors.New("no data dir")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(o.DataDir, "daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		who := "another clade daemon"
		if b, err := os.ReadFile(lock.Name()); err == nil && len(bytes.TrimSpace(b)) > 0 {
			who += " (pid " + string(bytes.TrimSpace(b)) + ")"
		}
		return fmt.Errorf("%s is using data dir %s: stop it first, or give this one another --data-dir", who, o.DataDir)
	}
	// The holder's pid, for the message above.
	if err := lock.Truncate(0); err == nil {
		_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if o.ImagesDir == "" {
		o.ImagesDir = filepath.Join(o.DataDir, "images")
	}
	st, err := store.OpenConfig(ctx, filepath.Join(o.DataDir, "clade.db"), store.Config{Node: o.Cluster.Node})
	if err != nil {
		return err
	}
	defer st.Close()
	// The key first: a wrong one stops the daemon before it changes anything.
	secrets, err := secret.Open(ctx, st, cmp.Or(o.KeyFile, filepath.Join(o.DataDir, "host.key")), o.KeyEnv, log)
	if err != nil {
		return err
	}
	if err := checkAtRestMode(ctx, st, o.DataDir, o.EncryptAtRest); err != nil {
		return err
	}
	// stateDir holds what sandboxes write and what snapshots hold.
	stateDir := o.DataDir
	liveEngineSandboxes := func() int { return 1 } // set once the engine exists
	liveAtExit := -1                               // counted before the engine closes
	if o.EncryptAtRest {
		plain := filepath.Join(o.DataDir, "plain")
		// A view the previous daemon left mounted may have sandboxes on
		// it until the engine says otherwise; one this start mounts has
		// none before the engine exists (a start that fails before then
		// unmounts it).
		if !atrest.Mounted(plain) {
			liveEngineSandboxes = func() int { return 0 }
		}
		fs, err := atrest.Mount(ctx, filepath.Join(o.DataDir, "encrypted"), plain, secrets.Key().Derive(atrest.Purpose))
		if err != nil {
			return err
		}
		stateDir = fs.Plain
		o.upperRoot = filepath.Join(fs.Plain, "upper")
		log.Info("encryption at rest: snapshots, sleep images, volumes and upper layers are encrypted", "dir", fs.Cipher)
		// Last out: unmounted only when no sandbox runs on it.
		defer func() {
			n := liveAtExit
			if n < 0 {
				n = liveEngineSandboxes()
			}
			if n > 0 {
				log.Info("keeping the encrypted view mounted for the sandboxes that run on", "sandboxes", n)
				return
			}
			if err := fs.Unmount(); err != nil {
				log.Warn("unmount the encrypted view", "err", err)
			}
		}()
	} else {
		log.Warn("encryption at rest is off: snapshots and sleep images hold sandbox memory (secrets included) in plaintext on disk; start the daemon with --encrypt-at-rest to encrypt them")
	}
	images, err := image.NewStore(o.ImagesDir, log)
	if err != nil {
		return err
	}
	eng, err := newEngine(o, log)
	if err != nil {
		return err
	}
	log.Info("engines", "default", eng.Name(), "available", strings.Join(eng.Names(), ","))
	// The versions' first reads run the engines' binaries (runsc, QEMU):
	// in the background, so that neither the start nor the first health
	// call waits for them.
	go engineVersion(ctx, eng)
	liveEngineSandboxes = func() int {
		ids, err := eng.List(context.Background())
		if err != nil {
			return 1 // unknown: keep what they may need
		}
		return len(ids)
	}
	hook, err := startNetwork(ctx, &o, log)
	if err != nil {
		return err
	}
	// Deferred before the manager's Close, so it runs after it: the
	// manager's drain hands prepared slots back first.
	defer func() {
		if n := hook.Network(); n != nil {
			if err := n.Close(); err != nil {
				log.Warn("network close", "err", err)
			}
		}
	}()
	o.Sandbox.Hooks = append(o.Sandbox.Hooks, hook)
	vols, err := volume.New(volume.Config{Dir: filepath.Join(stateDir, "volumes"), Store: st, Log: log, CrashAt: o.Sandbox.CrashAt, Sealer: secrets.Key()})
	if err != nil {
		return err
	}
	o.Sandbox.Hooks = append(o.Sandbox.Hooks, vols)
	o.Sandbox.Hooks = append(o.Sandbox.Hooks, secrets)
	o.Sandbox.Log = log
	o.Sandbox.HotImages = hotImages(o)
	o.Sandbox.SnapshotDir = filepath.Join(stateDir, "snapshots")
	o.Sandbox.SleepDir = filepath.Join(stateDir, "sleep")
	for _, d := range []string{o.Sandbox.SnapshotDir, o.Sandbox.SleepDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	copies, err := openObjectStore(ctx, o, secrets.Key(), log)
	if err != nil {
		return err
	}
	// Closed after the manager: its last sleeps' copies are cut, and the
	// next start copies what has no record (Reconcile).
	defer copies.Close()
	o.Sandbox.Copies = copies
	mgr := sandbox.New(o.Sandbox, eng, st, images)
	defer mgr.Close()
	// Each copy's image root goes to the store with it (once per root).
	copies.SetRoots(sandbox.NewMover(mgr).CopyRoot)
	// Before mgr.Close closes the engine, which can no longer list then,
	// and after the pools are drained: their sandboxes do not outlive the
	// daemon, so they must not keep the encrypted view mounted.
	defer func() {
		mgr.DrainPools()
		liveAtExit = liveEngineSandboxes()
	}()
	start := time.Now()
	if err := mgr.Reconcile(ctx); err != nil {
		log.Error("reconcile finished with errors", "err", err)
	}
	if err := mgr.Builds().Reap(ctx); err != nil {
		log.Error("removing the sandboxes of unfinished builds", "err", err)
	}
	log.Info("reconciled", "took", time.Since(start).Round(time.Millisecond))
	mgr.Pools().Start(ctx)
	go mgr.Lifetimes().WatchPressure(ctx)
	go mgr.Lifetimes().WatchLifetimes(ctx)
	go watchStore(ctx, st, log)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Image archives are spooled here while imported: in the encrypted
	// view when encryption is on, as nothing a client sends may touch the
	// disk in plaintext then.
	tmp := filepath.Join(stateDir, "tmp")
	_ = os.RemoveAll(tmp)                             // uploads a killed daemon left
	_ = os.RemoveAll(filepath.Join(o.DataDir, "tmp")) // and one from before the spool moved
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	registerCounters(reg, mgr.Counters(), mgr)
	var iln *ingressListener
	// The fronts drive the node through the service interface only.
	var svc service.Service = local.New(local.Config{Version: o.Version, EngineVersion: func() string { return engineVersion(ctx, eng) }, Addr: hook.Addr,
		Volumes: vols, Secrets: secrets, Engines: engineStatuses(eng)}, mgr)
	var internal http.Handler // a cluster's node-to-node routes
	var across httpapi.ClusterReads
	if o.Cluster.Etcd != "" {
		csvc, stop, err := joinCluster(ctx, o, svc, mgr, st, eng, log)
		if err != nil {
			return err
		}
		defer stop()
		svc = csvc
		internal = csvc.Internal()
		across = cluster.NewAcross(csvc)
	}
	code := codeint.NewProxy(svc, o.Code)
	defer code.Close()
	apiCfg := httpapi.Config{Version: o.Version, Log: log, TmpDir: tmp, Code: code, Internal: internal, Cluster: across}
	if o.Cluster.Etcd != "" {
		apiCfg.Node = o.Cluster.Node
	}
	if o.Ingress != "" {
		if iln, err = listenIngress(o, log); err != nil {
			return err
		}
		defer iln.Close()
		apiCfg.IngressURL = iln.url(o.IngressDomain)
		apiCfg.IngressCA = iln.caPEM
	}
	srv := httpapi.New(apiCfg, svc, reg)

	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Dir(o.Socket), 0o755); err != nil {
		return err
	}
	if err := claimSocket(o.Socket); err != nil {
		return err
	}
	errc := make(chan error, 4)
	if o.Listen != "" {
		if o.Token == "" {
			return errors.New("--listen needs --token-file: a TCP API without a token would let anyone who reaches the port run code")
		}
		// A client or peer node behind a cut link would hold an exec's
		// handler (and the exec, which keeps its sandbox busy) for the
		// kernel's ~15 minutes: its connection closes within 30 s.
		tln, err := deadpeer.NewListenConfig(deadpeer.Default).Listen(ctx, "tcp", o.Listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", o.Listen, err)
		}
		lns = append(lns, tln)
		// In a cluster the other nodes call with the cluster token (the
		// API token when --cluster-token-file is not given).
		var peerToken string
		if o.Cluster.Etcd != "" {
			peerToken = o.Cluster.token(o.Token)
		}
		ths := &http.Server{Handler: httpapi.RequireTokens(o.Token, peerToken, srv), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- ths.Serve(limitAPI(tln, "TCP API", log)) }()
		defer ths.Close()
		log.Info("serving TCP", "addr", tln.Addr().String())
	}
	if o.E2B != "" {
		stop, err := serveE2B(o, svc, code, iln, log, errc)
		if err != nil {
			return err
		}
		defer stop()
	}
	if iln != nil {
		icfg := o.IngressLimits
		icfg.Domain, icfg.Log = o.IngressDomain, log
		proxy := ingress.New(icfg, svc)
		defer proxy.Close()
		ihs := proxy.Server()
		// Under its caps of client connections; the server's hooks close
		// idle ones that no request was routed on (see ingress.Limit).
		if iln.tls != nil {
			// ServeTLS adds HTTP/2 and HTTP/1.1 to the ALPN protocols.
			ihs.TLSConfig = iln.tls
			go func() { errc <- ihs.ServeTLS(proxy.Limit(iln.Listener), "", "") }()
		} else {
			go func() { errc <- ihs.Serve(proxy.Limit(iln.Listener)) }()
		}
		defer ihs.Close()
		log.Info("serving the ingress", "addr", iln.Addr().String(), "domain", o.IngressDomain, "scheme", iln.scheme())
		if o.IngressDNS != "" {
			stop, err := serveIngressDNS(o, iln, log)
			if err != nil {
				return err
			}
			defer stop()
		}
	} else if o.IngressDNS != "" {
		return errors.New("--ingress-dns needs --ingress: it answers the ingress's names with the ingress's address")
	}
	// The socket last: a client that finds it answering finds every other
	// listener (TCP, E2B, ingress) bound too.
	uln, err := net.Listen("unix", o.Socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.Socket, err)
	}
	_ = os.Chmod(o.Socket, 0o660)
	lns = append(lns, uln)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ConnContext: httpapi.ConnContext, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() { errc <- hs.Serve(uln) }()
	log.Info("clade daemon serving", "socket", o.Socket, "data_dir", o.DataDir, "version", o.Version)
	if o.BuildDefaultImage {
		go func() {
			if err := images.EnsureDefault(ctx); err != nil && ctx.Err() == nil {
				log.Error("building the default image failed", "err", err)
			}
			if _, builtin := image.Builtin(o.E2BBaseImage); builtin && o.E2B != "" {
				if err := images.EnsureBuiltin(ctx, o.E2BBaseImage); err != nil && ctx.Err() == nil {
					log.Error("building the image of E2B's base template failed; a create of `base` tries again", "image", o.E2BBaseImage, "err", err)
				}
			}
		}()
	}
	if o.Ready != nil {
		o.Ready()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	log.Info("clade daemon stopped; sandboxes keep running")
	return nil
}

// claimSocket removes a stale socket file at path, and refuses one that
// another daemon is serving: taking it over would leave that daemon
// unreachable once this one exits.
func claimSocket(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another clade daemon is serving %s: stop it first, or give this one another --socket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// watchStore notices a database file removed or replaced under the daemon
// and says so at once; the store itself refuses every write from then on.
func watchStore(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := st.Check(); err != nil {
			log.Error("the database is gone: refusing every change until restart", "err", err)
			return
		}
	}
}

// registerCounters exports the service's admission and pressure decisions,
// and the warm pool's hits and misses.
func registerCounters(reg *prometheus.Registry, c *sandbox.Counters, mgr *sandbox.Manager) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "clade_pool_hits_total",
		Help: "creates, fork children and wakes that found a prepared sandbox of their shape in the warm pool"},
		func() float64 { h, _ := mgr.Pools().WarmStats(); return float64(h) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "clade_pool_misses_total",
		Help: "creates, fork children and wakes that found no prepared sandbox of their shape (the pool learns a shape at its second miss)"},
		func() float64 { _, m := mgr.Pools().WarmStats(); return float64(m) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "clade_hot_pool_hits_total",
		Help: "creates that claimed a started sandbox from the hot pool"},
		func() float64 { h, _ := mgr.Pools().HotStats(); return float64(h) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "clade_hot_pool_misses_total",
		Help: "creates that found no started sandbox of their shape in the hot pool"},
		func() float64 { _, m := mgr.Pools().HotStats(); return float64(m) }))
	for name, v := range map[string]interface{ Load() int64 }{
		"clade_admission_refused_total":  &c.AdmissionRefused,
		"clade_disk_floor_refused_total": &c.DiskRefused,
		"clade_pressure_sleeps_total":    &c.PressureSleeps,
		"clade_wakes_total":              &c.Wakes,
		"clade_idle_sleeps_total":        &c.IdleSleeps,
		"clade_timeout_sleeps_total":     &c.TimeoutSleeps,
		"clade_timeout_removals_total":   &c.TimeoutRemovals,
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name,
			Help: strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(name, "clade_"), "_total"), "_", " ")},
			func() float64 { return float64(v.Load()) }))
	}
}

// startNetwork sets up sandbox networking. When it cannot (no nftables,
// not root) and the default mode is none, the daemon runs on without it and
// only sandboxes that ask for internet are refused.
func startNetwork(ctx context.Context, o *Options, log *slog.Logger) (*network.Hook, error) {
	if o.DefaultNetwork == "" {
		o.DefaultNetwork = network.ModeInternet
	}
	cfg := o.Network
	cfg.StateDir = filepath.Join(o.DataDir, "network")
	cfg.Log = log
	n, nerr := network.New(ctx, cfg)
	if nerr != nil {
		if errdefs.Is(nerr, errdefs.Conflict) {
			return nil, nerr // another daemon's prefix or range: the message says what to do
		}
		if o.DefaultNetwork == network.ModeInternet {
			return nil, fmt.Errorf("sandbox networking: %w (run as root on a kernel with nftables, or use --default-network none)", nerr)
		}
		log.Warn("sandbox networking is unavailable; sandboxes get loopback only", "err", nerr)
		n = nil
	}
	hook, err := network.NewHook(n, o.DefaultNetwork, nerr)
	if err != nil {
		if n != nil {
			_ = n.Close()
		}
		return nil, err
	}
	return hook, nil
}

// hotImages is the hot pool's images beside the default one: those asked
// for, and with the E2B front on, the image of E2B's `base` template (the
// SDKs' default) with as many as the default image unless the list names
// it: a create of `base` claims a started sandbox as clade's own does.
func hotImages(o Options) map[string]int {
	base := o.E2BBaseImage
	if o.E2B == "" || base == "" || base == image.Default || o.Sandbox.HotPool == 0 {
		return o.Sandbox.HotImages
	}
	if _, named := o.Sandbox.HotImages[base]; named {
		return o.Sandbox.HotImages
	}
	hot := maps.Clone(o.Sandbox.HotImages)
	if hot == nil {
		hot = map[string]int{}
	}
	hot[base] = o.Sandbox.HotPool
	return hot
}
