package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EtcdAuth is how a node proves itself to etcd and checks etcd: TLS
// (--cluster-ca, --cluster-cert, --cluster-key) and etcd's own users
// (--cluster-user, --cluster-password-file). Its zero value is plain
// http without auth, as before.
//
// With CA set, the node speaks https to etcd and trusts only that CA;
// with Cert and Key too it presents them (etcd's --client-cert-auth).
// For `--cluster embed` the same three make the member serve TLS on its
// client and peer listeners and require a certificate of the CA from
// every client and peer: the certificate must carry the member's
// addresses (IP SANs) and both the server and client usages.
type EtcdAuth struct {
	CA, Cert, Key  string
	User, Password string
}

// TLS reports whether the node speaks TLS to etcd.
func (a EtcdAuth) TLS() bool { return a.CA != "" }

// Check refuses what cannot work, before anything starts: a certificate
// without its key, TLS files that do not load, a user without a password.
func (a EtcdAuth) Check() error {
	if (a.Cert == "") != (a.Key == "") {
		return errors.New("--cluster-cert and --cluster-key go together: give both, or neither")
	}
	if a.Cert != "" && a.CA == "" {
		return errors.New("--cluster-cert needs --cluster-ca: the CA that signed etcd's certificate (and this one)")
	}
	if (a.User == "") != (a.Password == "") {
		return errors.New("--cluster-user and --cluster-password-file go together")
	}
	if a.TLS() {
		if _, err := a.tlsConfig(); err != nil {
			return err
		}
	}
	return nil
}

// tlsConfig is the client's TLS: the CA's pool, and the node's own
// certificate when given.
func (a EtcdAuth) tlsConfig() (*tls.Config, error) {
	b, err := os.ReadFile(a.CA)
	if err != nil {
		return nil, fmt.Errorf("--cluster-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--cluster-ca %s holds no PEM certificate", a.CA)
	}
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if a.Cert != "" {
		kp, err := tls.LoadX509KeyPair(a.Cert, a.Key)
		if err != nil {
			return nil, fmt.Errorf("--cluster-cert/--cluster-key: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// serveTLS makes an embedded member's client and peer listeners serve
// TLS with the node's certificate, and require one of the CA from every
// client and peer.
func (a EtcdAuth) serveTLS(cfg *embed.Config) error {
	if a.Cert == "" {
		return errors.New("--cluster embed with --cluster-ca needs --cluster-cert and --cluster-key: the member serves TLS with them")
	}
	for _, ti := range []*struct {
		cert, key, ca *string
		auth          *bool
	}{
		{&cfg.ClientTLSInfo.CertFile, &cfg.ClientTLSInfo.KeyFile, &cfg.ClientTLSInfo.TrustedCAFile, &cfg.ClientTLSInfo.ClientCertAuth},
		{&cfg.PeerTLSInfo.CertFile, &cfg.PeerTLSInfo.KeyFile, &cfg.PeerTLSInfo.TrustedCAFile, &cfg.PeerTLSInfo.ClientCertAuth},
	} {
		*ti.cert, *ti.key, *ti.ca, *ti.auth = a.Cert, a.Key, a.CA, true
	}
	cfg.ClientAutoTLS, cfg.PeerAutoTLS = false, false
	return nil
}

// https turns the endpoints' scheme to https when the node speaks TLS.
func (a EtcdAuth) https(endpoints []string) []string {
	if !a.TLS() {
		return endpoints
	}
	out := make([]string, len(endpoints))
	for i, e := range endpoints {
		out[i] = "https://" + strings.TrimPrefix(strings.TrimPrefix(e, "http://"), "https://")
	}
	return out
}

// DialAuth connects to etcd with a's TLS and user and checks that it
// answers within timeout. A refusal says which side to fix: a CA that
// does not match etcd's certificate, a certificate etcd does not take, a
// wrong user or password, or an etcd that wants TLS or auth it was not
// given.
func DialAuth(ctx context.Context, endpoints []string, timeout time.Duration, a EtcdAuth) (*clientv3.Client, error) {
	endpoints = a.https(endpoints)
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop(), Username: a.User, Password: a.Password}
	if a.TLS() {
		tc, err := a.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	eps := strings.Join(endpoints, ",")
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if cfg.TLS != nil {
		// gRPC retries a failed handshake until the deadline and then
		// says only that: a handshake of our own says why.
		if err := probeTLS(cctx, endpoints, cfg.TLS); err != nil {
			return nil, dialError(eps, a, err)
		}
	}
	// clientv3.New authenticates (with a user) before it returns: its
	// error is the first answer.
	cfg.Context = cctx
	cli, err := clientv3.New(cfg)
	if err == nil {
		_, err = cli.Get(cctx, keyPrefix+"ping")
		if err != nil {
			cli.Close()
		}
	}
	if err != nil {
		return nil, dialError(eps, a, err)
	}
	// The client outlives the dial: its context was only for the check.
	cli.Close()
	cfg.Context = context.WithoutCancel(ctx)
	cli, err = clientv3.New(cfg)
	if err != nil {
		return nil, dialError(eps, a, err)
	}
	return cli, nil
}

// dialError says what a refused or failed dial means for the operator.
func dialError(eps string, a EtcdAuth, err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed) || strings.Contains(msg, "authentication failed"):
		return fmt.Errorf("etcd %s refused user %q: wrong --cluster-user or --cluster-password-file (%w)", eps, a.User, err)
	case errors.Is(err, rpctypes.ErrUserEmpty) || strings.Contains(msg, "user name is empty"):
		return fmt.Errorf("etcd %s has auth enabled: give --cluster-user and --cluster-password-file (%w)", eps, err)
	case strings.Contains(msg, "certificate signed by unknown authority") || strings.Contains(msg, "x509"):
		return fmt.Errorf("etcd %s: its TLS certificate does not verify against --cluster-ca %s: give the CA that signed it (%w)", eps, a.CA, err)
	case strings.Contains(msg, "bad certificate") || strings.Contains(msg, "certificate required"):
		return fmt.Errorf("etcd %s refused this node's certificate: give --cluster-cert and --cluster-key signed by etcd's CA (%w)", eps, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied) || strings.Contains(msg, "permission denied"):
		// Without a user, etcd takes a client certificate's common name
		// as the user.
		return fmt.Errorf("etcd %s has auth enabled and refused this node's calls (permission denied): give --cluster-user and --cluster-password-file of a user with read and write on /clade/ (%w)", eps, err)
	case strings.Contains(msg, "authentication is not enabled"):
		return fmt.Errorf("etcd %s does not have auth enabled: enable it (etcdctl auth enable) or leave out --cluster-user (%w)", eps, err)
	case !a.TLS() && (strings.Contains(msg, "first record does not look like a TLS handshake") || strings.Contains(msg, "connection reset") || errors.Is(err, context.DeadlineExceeded)):
		return fmt.Errorf("etcd %s does not answer over plain http: if it serves TLS, give --cluster-ca (and --cluster-cert, --cluster-key); else is it running? (%w)", eps, err)
	}
	return fmt.Errorf("etcd %s does not answer: %w (is it running? start one, or give --cluster embed)", eps, err)
}

// probeTLS completes a TLS handshake with the first endpoint that takes
// one, and waits briefly for a refusal of this node's certificate (TLS
// 1.3 sends it after the handshake). nil when one endpoint took it.
func probeTLS(ctx context.Context, endpoints []string, tc *tls.Config) error {
	var errs []error
	for _, e := range endpoints {
		u, err := url.Parse(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c := tc.Clone()
		c.NextProtos = []string{"h2"}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: c}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			return nil // it waits for our HTTP/2 preface: accepted
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
