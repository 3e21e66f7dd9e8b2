package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/internal/cluster"
	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/engine/qemu"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/sandbox"
	"github.com/clade-sandbox/clade/internal/system"
	"github.com/clade-sandbox/clade/sdk"
)

func newDaemonCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "daemon [flags]",
		Short: "Serve the clade API",
		Long: "Serves the clade API. Sandboxes outlive the daemon: a restarted daemon\n" +
			"reattaches to them and cleans up work a killed one left half done.",
		Example: "  sudo clade daemon\n" +
			"  sudo clade daemon --listen 127.0.0.1:7070 --token-file /etc/clade/token --ingress 127.0.0.1:8080 --ingress-domain clade.localhost",
		Args: nargs(0, 0),
	}
	fs := cmd.Flags()
	o := system.Options{Version: versionString()}
	fs.StringVar(&o.DataDir, "data-dir", "/var/lib/clade", "state: database, snapshots, sleep images, volumes, sandboxes' writes (image roots and blobs are in --images-dir)")
	fs.StringVar(&o.ImagesDir, "images-dir", "/var/cache/clade/images", "image roots and blobs; daemons with different data dirs may share it (make demo and the tests use this one, so the default image is built once)")
	fs.StringVar(&o.Socket, "socket", sdk.DefaultSocket, "unix socket to serve the API on")
	fs.StringVar(&o.Listen, "listen", "", "also serve TCP on ADDR (e.g. 127.0.0.1:7070); needs --token-file")
	tokenFile := fs.String("token-file", "", "file holding the bearer token for --listen")
	fs.StringVar(&o.Ingress, "ingress", "", "serve the ingress proxy on TCP ADDR (e.g. 127.0.0.1:8080): HTTP for Host PORT-ID.DOMAIN goes to that port inside sandbox ID (or name), waking it if it sleeps; needs --ingress-domain")
	fs.StringVar(&o.IngressDomain, "ingress-domain", "", "the domain of ingress host names, e.g. clade.localhost (curl and browsers resolve *.localhost to loopback; glibc's resolver, so Node and Python, needs --ingress-dns or libnss-myhostname: see docs/e2b.md); requests need the sandbox's traffic token (header X-Clade-Traffic-Token) unless it was created --public")
	fs.BoolVar(&o.IngressTLS, "ingress-tls", false, "serve the ingress over TLS (HTTP/2 and HTTP/1.1; URLs become https://PORT-ID.DOMAIN), as E2B code expects: with the\n--ingress-tls-cert certificate, else one for DOMAIN, *.DOMAIN, localhost and 127.0.0.1 signed by a CA the daemon makes once in\nDATA-DIR/ingress-ca.pem (key 0600; its certificate in ingress-ca.crt); trust it with `clade ca > ca.pem` and NODE_EXTRA_CA_CERTS,\nSSL_CERT_FILE or curl --cacert (see docs/e2b.md)")
	fs.StringVar(&o.IngressTLSCert, "ingress-tls-cert", "", "PEM `file` of the ingress's certificate chain (leaf first), for names under --ingress-domain; needs --ingress-tls-key; turns --ingress-tls on")
	fs.StringVar(&o.IngressDNS, "ingress-dns", "", "serve DNS on UDP and TCP ADDR (e.g. 127.0.0.1:5353): --ingress-domain and every name under it resolve to the ingress's address,\nevery other name is refused (never forwarded); point a resolver at it for the domain (systemd-resolved, dnsmasq: see docs/e2b.md)")
	fs.StringVar(&o.IngressTLSKey, "ingress-tls-key", "", "PEM `file` of the private key of --ingress-tls-cert")
	fs.DurationVar(&o.IngressLimits.ResponseHeaderTimeout, "ingress-response-timeout", ingress.DefaultResponseHeaderTimeout, "the ingress answers 504 when a sandbox sends no answer head this long after a request (with its body) reached it; only the head is timed, so downloads and server-sent events that keep sending are never cut, but long polls that answer later need it raised; 0 turns it off")
	fs.DurationVar(&o.IngressLimits.BodyIdleTimeout, "ingress-body-timeout", ingress.DefaultBodyIdleTimeout, "the ingress answers 408 (or cuts the answer) when a client's request body sends no bytes for this long; 0 turns it off")
	fs.DurationVar(&o.IngressLimits.SendTimeout, "ingress-send-timeout", ingress.DefaultSendTimeout, "the ingress drops a client connection that takes none of the bytes sent to it for this long (a client that stops reading would hold its request, and the sandbox awake, for ever); 0 turns it off")
	fs.IntVar(&o.IngressLimits.MaxConnsPerSandbox, "ingress-max-conns", ingress.DefaultMaxConnsPerSandbox, "most connections the ingress holds open to one sandbox's ports (requests in flight, kept-alive connections, WebSockets); one more gets a 503 with Retry-After; 0 turns the cap off")
	fs.IntVar(&o.IngressLimits.MaxClientConns, "ingress-max-client-conns", ingress.DefaultMaxClientConns(), "most client connections the ingress holds open at once, from everyone, with a token or without; one more is closed as it is accepted (the default, a quarter of the daemon's file limit and at most 4096, keeps the ingress and its sandbox connections to half the limit, so the API answers whatever clients open); 0 turns the cap off")
	fs.IntVar(&o.IngressLimits.MaxClientConnsPerIP, "ingress-max-client-conns-per-ip", ingress.DefaultMaxClientConnsPerIP(), "most client connections the ingress holds open from one address (an IPv6 one by its /64); one more is closed as it is accepted; 0 turns the cap off")
	fs.StringVar(&o.E2B, "e2b", "", "serve the E2B API (REST and envd) on TCP ADDR (e.g. 127.0.0.1:3000) for the unmodified E2B SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR, E2B_API_KEY=the --token-file token (see docs/e2b.md)")
	fs.StringVar(&o.E2BBaseImage, "e2b-base-image", image.E2BBase, "the image E2B's `base` template (the SDKs' default) runs on: e2b-base is built once from Debian's packages\n(python, pip, node, npm, git, curl, wget, sudo, ps, a user `user`); `default` is clade's lean image")
	fs.DurationVar(&o.Code.AnswerWait, "code-answer-timeout", codeint.DefaultAnswerWait, "how long a sandbox's code interpreter server may take to begin its answer to a request (a run's answer begins before its code runs; a kernel's start takes up to 2 minutes under load); past it the request gets a 503, and a run with a timeout ends at most this long past it (see docs/codeint.md)")
	fs.StringVar(&o.Engine, "engine", "gvisor", "engine that runs sandboxes: "+strings.Join(system.Engines(), ", "))
	fs.StringVar(&o.Runsc, "runsc", "", "runsc binary (default: next to clade, then $PATH)")
	fs.StringVar(&o.AgentPath, "agent", "", "clade-agent binary (default: next to clade)")
	fs.StringVar(&o.QEMU, "qemu", "", "the qemu engine's `qemu-system-x86_64` binary (default: from $PATH; `make deps-qemu` installs it)")
	fs.StringVar(&o.QEMUKernelDir, "qemu-kernel-dir", qemu.DefaultKernelDir, "`directory` of the qemu engine's guest kernel (vmlinux; `make deps-qemu` extracts it)")
	fs.IntVar(&o.QEMUTCGCacheMiB, "qemu-tcg-cache", qemu.DefaultTCGCacheMiB, "MiB of TCG translation cache per qemu VM when it runs without KVM: private to each VM, so it is most of what a fork child holds of its own;\nsmaller runs varied commands slower (the cache refills), larger costs memory per VM (see docs/engines.md)")
	fs.BoolVar(&o.BuildDefaultImage, "build-default-image", true, "build the default image at start if missing")
	fs.IntVar(&o.Sandbox.DefaultMemoryMiB, "default-memory", 512, "memory limit of sandboxes that ask for none, MiB")
	fs.IntVar(&o.Sandbox.DefaultDiskMiB, "default-disk", 10240, "MiB a sandbox that asks for no --disk may write (its files); 0: no cap")
	fs.IntVar(&o.Sandbox.MaxFork, "max-fork", 128, "most children one fork may ask for")
	fs.IntVar(&o.Sandbox.MaxMemoryMiB, "max-memory", 0, "largest memory limit a sandbox may have here, MiB: creates above it are refused, and a cluster moves no larger sandbox here (default 65536)")
	fs.Float64Var(&o.Sandbox.MaxCPUs, "max-cpus", 0, "most CPUs a sandbox may have here: creates above it are refused, and a cluster moves no larger sandbox here (default: the host's cores)")
	fs.IntVar(&o.Sandbox.MemoryFloorMiB, "memory-floor", 0, "MiB of host memory creates, forks and wakes must leave free (default 5% of RAM, at least 512)")
	fs.Float64Var(&o.Sandbox.MemoryOvercommit, "memory-overcommit", 1.0, "the memory limits of running sandboxes may add up to RATIO x the host's memory; above 1, memory pressure puts idle sandboxes to sleep (see --pressure-floor); 0 turns the cap off")
	fs.IntVar(&o.Sandbox.PressureFloorMiB, "pressure-floor", 0, "MiB of MemAvailable below which the least recently used idle sandboxes are put to sleep (default half the --memory-floor; -1 turns it off)")
	fs.IntVar(&o.Sandbox.DiskFloorMiB, "disk-floor", 1024, "MiB the data dir's file system must keep free: below it creates, forks, snapshots, sleeps and pulls are refused (retryable); 0 turns it off")
	fs.BoolVar(&o.Sandbox.DestroyUnrecorded, "destroy-unrecorded", false, "at start, destroy running engine sandboxes the database does not record (by default they are kept and logged: a lost database must not take them with it)")
	fs.IntVar(&o.Sandbox.RestoreParallel, "restore-parallel", 0, "restores of one fork run at once (default: twice the core count)")
	o.Sandbox.HotPool = 2
	fs.Var(hotPoolFlag{&o.Sandbox}, "hot-pool", "started sandboxes of the default shape kept for plain creates, which claim one in a few\nmilliseconds; N for the default image, or IMAGE=N,... per image (`default` is the default image;\ne.g. default=2,e2b-base=2); a shape plain creates asked for twice in 10 minutes gets one too, as many\nsuch shapes as the default image's N at most (each holds ~15 MiB idle; given back first when memory is\nshort); 0 turns it off. With --e2b, the image of E2B's base template keeps as many as the default\nimage unless the list names it")
	fs.IntVar(&o.Sandbox.WarmPool, "warm-pool", 16, "prepared (created, not started) sandboxes kept per shape for fast creates and forks; 0 turns the pool off")
	fs.StringVar(&o.DefaultNetwork, "default-network", "internet", "network of sandboxes that ask for none: internet (own address, egress under a policy) or none (loopback only)")
	netRange := fs.String("network-range", network.DefaultRange.String(), "IPv4 range sandbox addresses come from, one /30 each")
	fs.StringVar(&o.Network.Prefix, "network-prefix", "clade", "name of the nftables table and prefix of netns and veth names")
	fs.IntVar(&o.Network.PoolSize, "network-pool", 8, "sandbox networks kept built ahead")
	dnsUp := fs.String("dns-upstream", "", "comma-separated DNS servers (IP or IP:PORT) the sandboxes' resolver forwards to (default: the host's /etc/resolv.conf); none answers SERVFAIL")
	fs.StringVar(&o.KeyFile, "key-file", "", "the host key that seals secrets (default DATA-DIR/host.key, made 0600 at the first start)")
	fs.StringVar(&o.KeyEnv, "key-env", "CLADE_KEY", "environment variable that, when set, holds the host key (hex or base64 of 32 bytes) instead of --key-file")
	fs.BoolVar(&o.EncryptAtRest, "encrypt-at-rest", false, "keep snapshots, sleep images, volumes and sandbox upper layers encrypted on disk (gocryptfs under DATA-DIR/encrypted, keyed by the host key; needs gocryptfs and fuse3)")
	fs.StringVar(&o.Cluster.Etcd, "cluster", "", "join a cluster of daemons over etcd: etcd://HOST:2379[,HOST:2379...], or embed to run an etcd member inside this daemon\n(a first node, or with --cluster-peers a 3-member etcd among three daemons); needs --listen and --token-file; the nodes call each other with\n--cluster-token-file's token (default: the --token-file token, then the same on every node); without it the daemon is a node of its own and uses no etcd (see docs/cluster.md)")
	fs.StringVar(&o.Cluster.Node, "node", "", "this daemon's `name` in the cluster (default: the host name)")
	fs.StringVar(&o.Cluster.Advertise, "advertise", "", "`ADDR` other nodes reach this daemon's API on (default: --listen)")
	fs.StringVar(&o.Cluster.EmbedListen, "cluster-listen", "127.0.0.1:2379", "with --cluster embed: `ADDR` the embedded etcd serves clients on")
	fs.StringVar(&o.Cluster.EmbedPeerListen, "cluster-peer-listen", "127.0.0.1:2380", "with --cluster embed: `ADDR` the embedded etcd serves its peers on")
	fs.StringVar(&o.Cluster.EmbedPeers, "cluster-peers", "", "with --cluster embed: the initial members of a multi-member etcd, NAME=http://PEER-ADDR,... naming this node too (e.g. three daemons)")
	fs.DurationVar(&o.Cluster.MoveTimeout, "cluster-move-timeout", 2*time.Minute, "how long a node adopting another node's sleeping sandbox waits for its image from the object store: past it the sandbox stays asleep and the call gets a retryable 503")
	fs.DurationVar(&o.Cluster.LeaseTTL, "cluster-lease-ttl", 3*time.Second, "how long this node stays in the cluster after its last refresh (it refreshes every second); whole seconds, at least 2s (3s with --cluster embed)")
	clusterTokenFile := fs.String("cluster-token-file", "", "`file` holding the cluster token, the same on every node: the nodes call each other's API with it, and only it\nopens the routes only nodes may call; users keep the --token-file token (default: the --token-file token is the cluster token too)")
	fs.StringVar(&o.Cluster.EtcdAuth.CA, "cluster-ca", "", "PEM `file` of the CA of etcd's certificates: the node speaks TLS to etcd and trusts only it; with --cluster embed the\nmember serves TLS on its client and peer listeners (--cluster-peers then with https://) and requires certificates of this CA")
	fs.StringVar(&o.Cluster.EtcdAuth.Cert, "cluster-cert", "", "PEM `file` of this node's certificate for etcd (signed by --cluster-ca; for --cluster embed it must name the member's\naddresses and allow both server and client use); needs --cluster-key")
	fs.StringVar(&o.Cluster.EtcdAuth.Key, "cluster-key", "", "PEM `file` of the private key of --cluster-cert")
	fs.StringVar(&o.Cluster.EtcdAuth.User, "cluster-user", "", "etcd user (an etcd with auth enabled); needs --cluster-password-file")
	clusterPasswordFile := fs.String("cluster-password-file", "", "`file` holding the password of --cluster-user")
	fs.StringVar(&o.ObjectStore, "object-store", "", "copy sleep images and snapshots, once sealed, to a snapshot store and fetch them back when their\nlocal copy is gone: s3://BUCKET[/PREFIX]?endpoint=http(s)://HOST:PORT (credentials from\nAWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --object-store-credentials; objects encrypted in the\ndaemon with --encrypt-at-rest) or an absolute directory path (e.g. another disk or a shared mount)")
	fs.StringVar(&o.ObjectStoreCredentials, "object-store-credentials", "", "`file` of AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines for --object-store (keep it 0600)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve Go's profiler (net/http/pprof) on loopback ADDR, e.g. 127.0.0.1:6060, for profiling the daemon")
	_ = cmd.RegisterFlagCompletionFunc("engine", fixedValues(system.Engines()...))
	_ = cmd.RegisterFlagCompletionFunc("default-network", fixedValues("internet", "none"))
	_ = cmd.RegisterFlagCompletionFunc("log-level", fixedValues("debug", "info", "warn", "error"))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		if err := checkDaemonNumbers(o.Sandbox, o.Network.PoolSize, o.QEMUTCGCacheMiB); err != nil {
			return usagef(cmd, "%v", err)
		}
		if err := ingressLimits(&o.IngressLimits); err != nil {
			return usagef(cmd, "%v", err)
		}
		if o.Code.AnswerWait <= 0 {
			return usagef(cmd, "--code-answer-timeout must be positive (default %s)", codeint.DefaultAnswerWait)
		}
		if (o.IngressTLSCert == "") != (o.IngressTLSKey == "") {
			return usagef(cmd, "--ingress-tls-cert and --ingress-tls-key go together: give both, or neither for a certificate of the daemon's own CA")
		}
		if (o.IngressTLS || o.IngressTLSCert != "") && o.Ingress == "" {
			return usagef(cmd, "--ingress-tls, --ingress-tls-cert and --ingress-tls-key need --ingress ADDR")
		}
		if o.IngressTLSCert != "" {
			// Before the daemon takes anything: a wrong file is a
			// mistake to tell at once.
			if _, err := ingress.LoadKeyPair(o.IngressTLSCert, o.IngressTLSKey); err != nil {
				return err
			}
		}
		if o.EncryptAtRest && o.ObjectStore != "" && !strings.HasPrefix(o.ObjectStore, "s3://") {
			// Only an S3 store's objects are sealed in the daemon: a
			// directory store would get sandbox memory in plaintext.
			return usagef(cmd, "--encrypt-at-rest with a directory --object-store (%s) would copy sleep images and snapshots, sandbox memory included, there in plaintext: only an s3:// store's objects are encrypted; use one, or no --object-store", o.ObjectStore)
		}
		if err := clusterFlags(cmd, &o.Cluster, *clusterTokenFile, *clusterPasswordFile); err != nil {
			return err
		}
		rng, err := netip.ParsePrefix(*netRange)
		if err != nil {
			return fmt.Errorf("bad --network-range %q: use an IPv4 CIDR such as %s", *netRange, network.DefaultRange)
		}
		o.Network.Range = rng
		switch *dnsUp {
		case "":
		case "none":
			o.Network.NoUpstream = true
		default:
			for _, u := range strings.Split(*dnsUp, ",") {
				if a, err := netip.ParseAddr(u); err == nil {
					u = netip.AddrPortFrom(a, 53).String()
				} else if _, err := netip.ParseAddrPort(u); err != nil {
					return fmt.Errorf("bad --dns-upstream %q: use IP or IP:PORT", u)
				}
				o.Network.Upstreams = append(o.Network.Upstreams, u)
			}
		}
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("token file: %w", err)
			}
			o.Token = strings.TrimSpace(string(b))
			if o.Token == "" {
				return fmt.Errorf("token file %s is empty", *tokenFile)
			}
		}
		if o.AgentPath == "" {
			if exe, err := os.Executable(); err == nil {
				o.AgentPath = filepath.Join(filepath.Dir(exe), "clade-agent")
			}
		}
		// Only tests set this: it makes the daemon SIGKILL itself at a named
		// point of a create or remove.
		o.Sandbox.CrashAt = os.Getenv("CLADE_CRASH_AT")
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(*level)); err != nil {
			return usagef(cmd, "bad --log-level %q: use debug, info, warn or error", *level)
		}
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
		if *pprofAddr != "" {
			if err := servePprof(*pprofAddr, o.Log); err != nil {
				return err
			}
		}
		return system.Run(ctx, o)
	}
	return cmd
}

// maxOvercommit is the largest --memory-overcommit: far past any use, and
// its limit in MiB fits an int on any host.
const maxOvercommit = 1000

// checkDaemonNumbers refuses numeric flags out of their range before the
// daemon takes anything: a negative pool or parallelism would panic the
// start, a negative floor or ratio would quietly turn a guard off.
func checkDaemonNumbers(c sandbox.Config, networkPool, tcgCache int) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"hot-pool", c.HotPool}, {"warm-pool", c.WarmPool}, {"network-pool", networkPool},
		{"restore-parallel", c.RestoreParallel}, {"memory-floor", c.MemoryFloorMiB}, {"disk-floor", c.DiskFloorMiB},
		{"default-disk", c.DefaultDiskMiB}} {
		if f.v < 0 {
			return fmt.Errorf("--%s %d: give 0 or more", f.name, f.v)
		}
	}
	switch {
	case tcgCache < 1 || tcgCache > 2048:
		return fmt.Errorf("--qemu-tcg-cache %d: give 1 to 2048 MiB", tcgCache)
	case c.MaxFork < 1:
		return fmt.Errorf("--max-fork %d: give 1 or more", c.MaxFork)
	case c.PressureFloorMiB < -1:
		return fmt.Errorf("--pressure-floor %d: give MiB, 0 for the default or -1 for off", c.PressureFloorMiB)
	case !(c.MemoryOvercommit >= 0 && c.MemoryOvercommit <= maxOvercommit):
		// NaN turned the cap off; +Inf or a huge ratio overflowed the
		// limit in MiB to a negative one, which refused every create.
		return fmt.Errorf("--memory-overcommit %g: give a ratio from 0 to %d such as 1.5, or 0 for no cap", c.MemoryOvercommit, maxOvercommit)
	case c.MaxMemoryMiB != 0 && (c.MaxMemoryMiB < sandbox.MinMemoryMiB || c.MaxMemoryMiB > sandbox.DefaultConfig().MaxMemoryMiB):
		return fmt.Errorf("--max-memory %d: give %d to %d MiB, or 0 for the default", c.MaxMemoryMiB, sandbox.MinMemoryMiB, sandbox.DefaultConfig().MaxMemoryMiB)
	case c.DefaultMemoryMiB < sandbox.MinMemoryMiB || c.DefaultMemoryMiB > sandbox.DefaultConfig().MaxMemoryMiB:
		return fmt.Errorf("--default-memory %d: give %d to %d MiB", c.DefaultMemoryMiB, sandbox.MinMemoryMiB, sandbox.DefaultConfig().MaxMemoryMiB)
	case c.MaxMemoryMiB != 0 && c.DefaultMemoryMiB > c.MaxMemoryMiB:
		return fmt.Errorf("--max-memory %d is below the --default-memory %d MiB a sandbox that asks for none gets", c.MaxMemoryMiB, c.DefaultMemoryMiB)
	case !(c.MaxCPUs >= 0 && c.MaxCPUs <= 4096):
		return fmt.Errorf("--max-cpus %g: give more than 0 (at most 4096), or 0 for the host's cores", c.MaxCPUs)
	case c.MaxCPUs != 0 && cmp.Or(c.DefaultCPUs, sandbox.DefaultConfig().DefaultCPUs) > c.MaxCPUs:
		return fmt.Errorf("--max-cpus %g is below the %g CPUs a sandbox that asks for none gets", c.MaxCPUs, cmp.Or(c.DefaultCPUs, sandbox.DefaultConfig().DefaultCPUs))
	}
	return nil
}

// servePprof serves net/http/pprof on addr, which must be a loopback
// address: profiles show memory and arguments, and the endpoint has no
// authentication.
func servePprof(addr string, log *slog.Logger) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("bad --pprof %q: give a loopback ADDR:PORT such as 127.0.0.1:6060", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("profiler serving", "addr", ln.Addr().String())
	go func() { _ = http.Serve(ln, mux) }()
	return nil
}

// ingressLimits maps the ingress limit flags onto its config, whose zero
// means "the default": a flag's 0 turns the limit off.
func ingressLimits(c *ingress.Config) error {
	if c.ResponseHeaderTimeout < 0 || c.BodyIdleTimeout < 0 || c.SendTimeout < 0 || c.MaxConnsPerSandbox < 0 || c.MaxClientConns < 0 || c.MaxClientConnsPerIP < 0 {
		return fmt.Errorf("--ingress-response-timeout, --ingress-body-timeout, --ingress-send-timeout, --ingress-max-conns, --ingress-max-client-conns and --ingress-max-client-conns-per-ip must not be negative (0 turns a limit off)")
	}
	off := func(v *time.Duration) {
		if *v == 0 {
			*v = -1
		}
	}
	off(&c.ResponseHeaderTimeout)
	off(&c.BodyIdleTimeout)
	off(&c.SendTimeout)
	for _, n := range []*int{&c.MaxConnsPerSandbox, &c.MaxClientConns, &c.MaxClientConnsPerIP} {
		if *n == 0 {
			*n = -1
		}
	}
	return nil
}

// clusterFlags checks the cluster flags: none of them without --cluster,
// and a node name by default the host's.
func clusterFlags(cmd *cobra.Command, c *system.ClusterOptions, tokenFile, passwordFile string) error {
	if c.Etcd == "" {
		for _, f := range []string{"node", "advertise", "cluster-listen", "cluster-peer-listen", "cluster-peers", "cluster-lease-ttl", "cluster-move-timeout",
			"cluster-token-file", "cluster-ca", "cluster-cert", "cluster-key", "cluster-user", "cluster-password-file"} {
			if cmd.Flags().Changed(f) {
				return usagef(cmd, "--%s needs --cluster (embed or etcd://HOST:2379)", f)
			}
		}
		return nil
	}
	if c.Etcd != "embed" && !strings.HasPrefix(c.Etcd, "etcd://") {
		return usagef(cmd, "bad --cluster %q: give embed, or etcd://HOST:2379[,HOST:2379...]", c.Etcd)
	}
	if c.Etcd != "embed" {
		for _, f := range []string{"cluster-listen", "cluster-peer-listen", "cluster-peers"} {
			if cmd.Flags().Changed(f) {
				return usagef(cmd, "--%s is for --cluster embed", f)
			}
		}
	}
	if c.MoveTimeout < time.Second || c.MoveTimeout > time.Hour {
		return usagef(cmd, "--cluster-move-timeout %s: give 1s to 1h", c.MoveTimeout)
	}
	if c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0 || c.LeaseTTL > 5*time.Minute {
		return usagef(cmd, "--cluster-lease-ttl %s: give whole seconds from 2s to 5m", c.LeaseTTL)
	}
	if c.Etcd == "embed" && c.LeaseTTL < cluster.EmbedMinLeaseTTL {
		return usagef(cmd, "--cluster-lease-ttl %s: the embedded etcd's shortest lease is %s (it raises a shorter one to 1.5 election timeouts)", c.LeaseTTL, cluster.EmbedMinLeaseTTL)
	}
	var err error
	if tokenFile != "" {
		if c.Token, err = readSecretFile(tokenFile, "--cluster-token-file"); err != nil {
			return err
		}
	}
	if passwordFile != "" {
		if c.EtcdAuth.Password, err = readSecretFile(passwordFile, "--cluster-password-file"); err != nil {
			return err
		}
	}
	if err := c.EtcdAuth.Check(); err != nil {
		return usagef(cmd, "%v", err)
	}
	if c.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node: no host name to default to (%v): give --node NAME", err)
		}
		c.Node = h
	}
	return nil
}

// readSecretFile reads a token or password file: its content without
// surrounding white space, never empty.
func readSecretFile(path, flag string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s %s is empty", flag, path)
	}
	return v, nil
}
