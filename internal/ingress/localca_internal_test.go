package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLocalCA(t *testing.T) {
	dir := t.TempDir()
	ca, replaced, err := LoadCA(dir, "Clade.Test.")
	if err != nil || replaced {
		t.Fatalf("LoadCA: %v replaced %v", err, replaced)
	}
	st, err := os.Stat(filepath.Join(dir, CAFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want 0600", err, st.Mode())
	}
	if pub, err := os.ReadFile(filepath.Join(dir, CACertFile)); err != nil || string(pub) != string(ca.PEM) || strings.Contains(string(pub), "PRIVATE") {
		t.Fatalf("cert file: %v %q", err, pub)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}

	t.Run("reused", func(t *testing.T) {
		again, replaced, err := LoadCA(dir, "clade.test")
		if err != nil || replaced || string(again.PEM) != string(ca.PEM) {
			t.Fatalf("second LoadCA: %v replaced %v, same %v", err, replaced, string(again.PEM) == string(ca.PEM))
		}
		if b, err := ReadCACert(dir); err != nil || string(b) != string(ca.PEM) {
			t.Fatalf("ReadCACert: %v", err)
		}
	})

	t.Run("leaf verifies for sandbox names and loopback only", func(t *testing.T) {
		leaf, err := ca.Leaf("clade.test")
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.PEM)
		for _, name := range []string{"3000-abc.clade.test", "clade.test", "localhost", "127.0.0.1", "::1"} {
			if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		for _, name := range []string{"a.b.clade.test", "example.com", "10.0.0.1"} {
			if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err == nil {
				t.Errorf("%s verified", name)
			}
		}
	})

	t.Run("constraints refuse other names", func(t *testing.T) {
		// Even a certificate the CA's key signs for another name does not
		// verify: the key's leak would not make it a CA for the world.
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "example.com"}, DNSNames: []string{"example.com"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.PEM)
		if _, err := c.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: pool}); err == nil {
			t.Fatal("a certificate for example.com verified under the local CA")
		}
	})

	t.Run("another domain replaces it", func(t *testing.T) {
		d2 := t.TempDir()
		first, _, err := LoadCA(d2, "one.test")
		if err != nil {
			t.Fatal(err)
		}
		second, replaced, err := LoadCA(d2, "two.test")
		if err != nil || !replaced || string(second.PEM) == string(first.PEM) {
			t.Fatalf("LoadCA for another domain: %v replaced %v", err, replaced)
		}
	})

	t.Run("broken files are refused, not overwritten", func(t *testing.T) {
		for name, content := range map[string]string{
			"garbage":   "not a pem file",
			"cert only": string(ca.PEM),
		} {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, CAFile), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, err := LoadCA(d, "clade.test"); err == nil || !strings.Contains(err.Error(), "remove it") {
				t.Errorf("%s: LoadCA = %v, want an error saying what to do", name, err)
			}
			if b, _ := os.ReadFile(filepath.Join(d, CAFile)); string(b) != content {
				t.Errorf("%s: the file was changed", name)
			}
		}
	})

	t.Run("key pair flags", func(t *testing.T) {
		d := t.TempDir()
		if _, err := LoadKeyPair(filepath.Join(d, "nope.crt"), filepath.Join(d, "nope.key")); err == nil || !strings.Contains(err.Error(), "nope.crt") {
			t.Errorf("missing files: %v", err)
		}
		os.WriteFile(filepath.Join(d, "a.crt"), ca.PEM, 0o644)
		os.WriteFile(filepath.Join(d, "a.key"), []byte("junk"), 0o600)
		if _, err := LoadKeyPair(filepath.Join(d, "a.crt"), filepath.Join(d, "a.key")); err == nil || !strings.Contains(err.Error(), "PEM") {
			t.Errorf("junk key: %v", err)
		}
	})
}
