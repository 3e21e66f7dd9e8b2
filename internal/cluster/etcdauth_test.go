package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a CA made in the test, in memory; its PEM in a file.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, name+".crt")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a certificate for 127.0.0.1, for servers and clients both
// (an etcd member is each to its peers), and its key.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", kb)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdTLSAndAuth: an embedded member serving TLS with certificates
// the test made refuses a node without its CA, one with another CA, and
// one without a certificate of its own, each with an error that says
// which flag to fix; a node with the CA and a certificate joins. With
// etcd's auth on, a node without the user, or with a wrong password, is
// refused saying so, and one with them joins.
func TestEtcdTLSAndAuth(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "cluster-ca")
	other := newTestCA(t, dir, "other-ca")
	cert, key := ca.issue(t, dir, "n1")
	strangerCert, strangerKey := other.issue(t, dir, "stranger")
	good := EtcdAuth{CA: ca.file, Cert: cert, Key: key}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}

	e, err := StartEmbed(t.Context(), Embed{Name: "tls", Dir: filepath.Join(dir, "etcd"), Client: freeAddr(t), Peer: freeAddr(t), Auth: good})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if !strings.HasPrefix(e.Endpoints[0], "https://") {
		t.Fatalf("endpoints %v: want https", e.Endpoints)
	}
	plain := []string{strings.Replace(e.Endpoints[0], "https://", "http://", 1)}

	for _, tc := range []struct {
		name string
		auth EtcdAuth
		want string // in the error
	}{
		{"no TLS at all", EtcdAuth{}, "over plain http: if it serves TLS, give --cluster-ca"},
		{"another CA", EtcdAuth{CA: other.file, Cert: strangerCert, Key: strangerKey}, "does not verify against --cluster-ca"},
		{"the CA, no certificate", EtcdAuth{CA: ca.file}, "refused this node's certificate"},
		{"the CA, a stranger's certificate", EtcdAuth{CA: ca.file, Cert: strangerCert, Key: strangerKey}, "refused this node's certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			cli, err := DialAuth(t.Context(), plain, 3*time.Second, tc.auth)
			if err == nil {
				cli.Close()
				t.Fatal("dialled an etcd that serves TLS without what it requires")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			t.Logf("refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}

	cli, err := DialAuth(t.Context(), plain, 5*time.Second, good)
	if err != nil {
		t.Fatalf("with the CA and a certificate: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	c := join(t, cli, "n1", "")
	if got := nodeNames(t, c); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("nodes %v, want [n1]", got)
	}
	// n1 leaves before auth goes on: its client has no user, and its
	// refreshes would be refused.
	c.Close()

	// etcd's auth: a root user with a password, then auth on.
	pw := "pw-" + strings.Repeat("x", 12)
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(t.Context(), "root"); return err },
		func() error { _, err := cli.UserAdd(t.Context(), "root", pw); return err },
		func() error { _, err := cli.UserGrantRole(t.Context(), "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(t.Context()); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if a, err := DialAuth(t.Context(), plain, 5*time.Second, EtcdAuth{CA: ca.file, Cert: cert, Key: key, User: "root", Password: pw}); err == nil {
			_, _ = a.AuthDisable(t.Context())
			a.Close()
		}
	})
	for _, tc := range []struct {
		name, user, pw, want string
	}{
		{"no user", "", "", "has auth enabled"},
		{"wrong password", "root", "nope", "refused user \"root\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := good
			a.User, a.Password = tc.user, tc.pw
			cli, err := DialAuth(t.Context(), plain, 3*time.Second, a)
			if err == nil {
				cli.Close()
				t.Fatal("dialled an etcd with auth on without its user")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	a := good
	a.User, a.Password = "root", pw
	acli, err := DialAuth(t.Context(), plain, 5*time.Second, a)
	if err != nil {
		t.Fatalf("with the user: %v", err)
	}
	t.Cleanup(func() { acli.Close() })
	c2 := join(t, acli, "n2", "")
	t.Cleanup(c2.Close)
	if got := nodeNames(t, c2); len(got) != 1 || got[0] != "n2" {
		t.Fatalf("nodes %v, want [n2]", got)
	}
}

func TestEtcdAuthCheck(t *testing.T) {
	for _, tc := range []struct {
		a    EtcdAuth
		want string
	}{
		{EtcdAuth{Cert: "c"}, "go together"},
		{EtcdAuth{Cert: "c", Key: "k"}, "needs --cluster-ca"},
		{EtcdAuth{User: "u"}, "--cluster-user and --cluster-password-file"},
		{EtcdAuth{CA: "/nonexistent/ca.pem"}, "--cluster-ca"},
	} {
		if err := tc.a.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.a, err, tc.want)
		}
	}
}
