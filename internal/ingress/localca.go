package ingress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The local CA's files in its directory (the daemon's data dir): CAFile
// holds its key and certificate (0600), CACertFile its certificate alone,
// for clients to trust (NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, curl --cacert).
const (
	CAFile     = "ingress-ca.pem"
	CACertFile = "ingress-ca.crt"
)

// caValidity is the local CA's life; leafValidity that of the certificates
// it issues, one at each start of the daemon (under the 398 days browsers
// take).
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
)

// LocalCA is the ingress's own certificate authority, made once under a
// directory and kept across restarts. It can sign only names under the
// ingress domain and localhost, and loopback addresses (X.509 name
// constraints): trusting it trusts nothing else, even if its key leaked.
type LocalCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// LoadCA returns the local CA kept in dir for domain, making it (an ECDSA
// P-256 key and a self-signed certificate) when dir holds none, or one
// whose constraints do not cover domain (a changed --ingress-domain:
// clients must trust the new one). The key file is written 0600 and
// atomically (a temporary file renamed), so a crash leaves the old one or
// the new one, never half a file. It also rewrites dir/CACertFile.
// replaced reports whether a CA that existed was replaced.
func LoadCA(dir, domain string) (ca *LocalCA, replaced bool, err error) {
	domain = strings.ToLower(strings.Trim(domain, "."))
	if domain == "" {
		return nil, false, errors.New("the ingress's local CA needs the ingress domain")
	}
	path := filepath.Join(dir, CAFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		ca, err = parseCA(b)
		if err != nil {
			return nil, false, fmt.Errorf("the ingress's local CA %s: %w (remove it to make a new one, then trust the new one)", path, err)
		}
		if !ca.covers(domain) {
			ca, replaced = nil, true
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("the ingress's local CA: %w", err)
	}
	if ca == nil {
		if ca, err = newCA(domain); err != nil {
			return nil, false, err
		}
		kb, err := x509.MarshalECPrivateKey(ca.key)
		if err != nil {
			return nil, false, err
		}
		all := append(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), ca.PEM...)
		if err := writeAtomic(path, all, 0o600); err != nil {
			return nil, false, fmt.Errorf("writing the ingress's local CA: %w", err)
		}
	}
	if err := writeAtomic(filepath.Join(dir, CACertFile), ca.PEM, 0o644); err != nil {
		return nil, false, fmt.Errorf("writing the ingress's CA certificate: %w", err)
	}
	return ca, replaced, nil
}

// ReadCACert returns the PEM of the local CA's certificate kept in dir
// (the daemon's data dir): dir/CACertFile, which LoadCA wrote, readable
// by anyone. It is a NotExist error when the daemon never served the
// ingress over TLS with its own CA there.
func ReadCACert(dir string) ([]byte, error) {
	path := filepath.Join(dir, CACertFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pem.EncodeToMemory(blk), nil
}

func parseCA(b []byte) (*LocalCA, error) {
	ca := &LocalCA{}
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		switch blk.Type {
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("its key: %w", err)
			}
			ca.key = k
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("its certificate: %w", err)
			}
			ca.cert, ca.PEM = c, pem.EncodeToMemory(blk)
		}
	}
	if ca.key == nil || ca.cert == nil {
		return nil, errors.New("it holds no key and certificate")
	}
	if !ca.key.PublicKey.Equal(ca.cert.PublicKey) {
		return nil, errors.New("its key is not its certificate's")
	}
	return ca, nil
}

// covers reports whether the CA may sign domain's names and is valid for
// a while yet (a leaf's life).
func (ca *LocalCA) covers(domain string) bool {
	return slices.Contains(ca.cert.PermittedDNSDomains, domain) && time.Now().Add(leafValidity).Before(ca.cert.NotAfter)
}

func newCA(domain string) (*LocalCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{Organization: []string{"clade"}, CommonName: "clade ingress CA for " + domain},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caValidity),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{domain, "localhost"},
		PermittedIPRanges:           []*net.IPNet{{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)}, {IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the ingress's local CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &LocalCA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf issues a certificate for the ingress of domain: domain, *.domain
// (every PORT-ID.domain), localhost, 127.0.0.1 and ::1, with a fresh
// ECDSA P-256 key.
func (ca *LocalCA) Leaf(domain string) (tls.Certificate, error) {
	domain = strings.ToLower(strings.Trim(domain, "."))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"clade"}, CommonName: "*." + domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{domain, "*." + domain, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issuing the ingress's certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// writeAtomic writes b to path through a temporary file in its directory,
// synced and renamed over path, the directory synced after.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return os.Chmod(path, mode)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename: nothing
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// TLSConfig returns the ingress's TLS configuration for cert: TLS 1.2 and
// up; the server adds HTTP/2 and HTTP/1.1 to its ALPN protocols.
func TLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// LoadKeyPair reads the ingress's certificate (PEM, the chain after the
// leaf) and key, saying which file is wrong.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.ReadFile(f); err != nil {
			return tls.Certificate{}, fmt.Errorf("--ingress-tls-cert/--ingress-tls-key: %w", err)
		}
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("--ingress-tls-cert %s with --ingress-tls-key %s: %w (give a PEM certificate chain and the PEM key of its first certificate)", certFile, keyFile, err)
	}
	return c, nil
}
