package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Embed is an etcd member run inside this process (`--cluster embed`).
type Embed struct {
	// Name is the member's name (the node's).
	Name string
	// Dir holds the member's data (DATA-DIR/etcd).
	Dir string
	// Client and Peer are the loopback (or private) addresses it listens
	// on, HOST:PORT.
	Client, Peer string
	// Peers, when set, is the initial cluster of a multi-member etcd:
	// NAME=http://HOST:PORT,... naming this member too. Empty: a
	// one-member etcd.
	Peers string
	// Auth, with a CA, makes the member serve TLS on both listeners
	// and require the CA's certificates (see EtcdAuth).
	Auth EtcdAuth
	// Log, when set, gets the member's warnings and its leader changes.
	Log *slog.Logger
}

// EmbedMinLeaseTTL is the shortest lease the embedded member grants: etcd
// raises a shorter one to 1.5 election timeouts without a word, so a node
// asking for less would stay in the cluster longer than its
// --cluster-lease-ttl says.
const EmbedMinLeaseTTL = 3 * time.Second

// Etcd is a running embedded member.
type Etcd struct {
	e *embed.Etcd
	// Endpoints are the client URLs to reach it.
	Endpoints []string
}

// StartEmbed starts an embedded etcd member and waits until it serves
// (its cluster has a leader), or ctx ends.
func StartEmbed(ctx context.Context, c Embed) (*Etcd, error) {
	if c.Name == "" || c.Dir == "" {
		return nil, errors.New("embedded etcd: no name or data dir")
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if c.Log != nil {
		cfg.LogLevel = "warn"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(c.Log))
	}
	// Heartbeats every 200 ms and an election after 2 s without one
	// (etcd's defaults are 100 ms and 1 s): a clade node shares its cores
	// with the sandboxes it runs and its disk with their snapshots, and
	// under that load a 1 s election timeout sees leaders that are only
	// slow. Each new leader renews every lease, so a cluster that keeps
	// electing never lets a gone node's lease lapse. A failover takes a
	// second longer.
	cfg.TickMs, cfg.ElectionMs = 200, 2000 // EmbedMinLeaseTTL follows
	cu, err := hostURL(c.Client, "--cluster-listen")
	if err != nil {
		return nil, err
	}
	pu, err := hostURL(c.Peer, "--cluster-peer-listen")
	if err != nil {
		return nil, err
	}
	if c.Auth.TLS() {
		if err := c.Auth.serveTLS(cfg); err != nil {
			return nil, err
		}
		cu.Scheme, pu.Scheme = "https", "https"
		if strings.Contains(c.Peers, "=http://") {
			return nil, fmt.Errorf("--cluster-peers %q: with --cluster-ca the members speak TLS to each other: give https:// peer URLs", c.Peers)
		}
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialClusterToken = "clade"
	if c.Peers != "" {
		if !strings.Contains(c.Peers, c.Name+"=") {
			return nil, fmt.Errorf("--cluster-peers %q does not name this node (%s=http://%s)", c.Peers, c.Name, c.Peer)
		}
		cfg.InitialCluster = c.Peers
	} else {
		cfg.InitialCluster = cfg.InitialClusterFromName(c.Name)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start the embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	if c.Log != nil {
		go logLeaders(e, c.Log)
	}
	return &Etcd{e: e, Endpoints: []string{cu.String()}}, nil
}

// Close stops the member.
func (e *Etcd) Close() { e.e.Close() }

func hostURL(hostport, flag string) (url.URL, error) {
	if _, _, err := net.SplitHostPort(hostport); err != nil {
		return url.URL{}, fmt.Errorf("bad %s %q: give HOST:PORT such as 127.0.0.1:2379", flag, hostport)
	}
	return url.URL{Scheme: "http", Host: hostport}, nil
}

// ParseEndpoints reads `etcd://HOST:PORT[,HOST:PORT...]` into client URLs.
func ParseEndpoints(s string) ([]string, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok || rest == "" {
		return nil, fmt.Errorf("bad --cluster %q: give etcd://HOST:2379[,HOST:2379...] or embed", s)
	}
	var eps []string
	for _, hp := range strings.Split(rest, ",") {
		if _, _, err := net.SplitHostPort(hp); err != nil {
			return nil, fmt.Errorf("bad --cluster endpoint %q: give HOST:PORT", hp)
		}
		eps = append(eps, "http://"+hp)
	}
	return eps, nil
}

// Dial connects to etcd over plain http, without auth, and checks that
// it answers within timeout (DialAuth with TLS or a user).
func Dial(ctx context.Context, endpoints []string, timeout time.Duration) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(endpoints, ","), err)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(cctx, keyPrefix+"ping"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd %s does not answer: %w (is it running? start one, or give --cluster embed)", strings.Join(endpoints, ","), err)
	}
	return cli, nil
}
