package ingress_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// tlsTarget is a sandbox port behind a TLS ingress, reached on loopback
// whatever its host name (no name is looked up), trusting roots.
type tlsTarget struct {
	base, addr, token string
	roots             *x509.CertPool
}

func newTLSTarget(t *testing.T, sb sdk.Sandbox, port int, caPEM []byte) *tlsTarget {
	t.Helper()
	if sb.Ingress == nil || !strings.HasPrefix(sb.Ingress.URL, "https://{port}-") {
		t.Fatalf("sandbox shows no https ingress URL: %+v", sb.Ingress)
	}
	base := strings.Replace(sb.Ingress.URL, "{port}", strconv.Itoa(port), 1)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("no certificate in %q", caPEM)
	}
	return &tlsTarget{base: base, addr: net.JoinHostPort("127.0.0.1", u.Port()), token: sb.Ingress.TrafficToken, roots: roots}
}

// client returns an https client of the target: HTTP/2 when h2, else
// HTTP/1.1 only.
func (tg *tlsTarget) client(t *testing.T, h2 bool, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", tg.addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (tg *tlsTarget) do(t *testing.T, hc *http.Client, method, path string, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, tg.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(ingress.TokenHeader, tg.token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp, string(b)
}

// gone is E2B's answer for a sandbox that does not exist.
func gone(ref string) string {
	return `{"sandboxId":"` + ref + `","message":"The sandbox was not found","code":502}`
}

func TestIngressTLS(t *testing.T) {
	d := startDaemon(t, "--ingress-tls")
	c := d.Client
	ctx := t.Context()
	caPEM, err := c.IngressCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(d.DataDir, ingress.CACertFile)); err != nil || !bytes.Equal(b, caPEM) {
		t.Fatalf("%s: %v, same as the API's: %v", ingress.CACertFile, err, bytes.Equal(b, caPEM))
	}
	if st, err := os.Stat(filepath.Join(d.DataDir, ingress.CAFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key file: %v %v", err, st)
	}
	for _, args := range [][]string{{"--host", d.Socket, "ca"}, {"ca", "--data-dir", d.DataDir}} {
		out, err := exec.Command(d.Bin, args...).Output()
		if err != nil || !bytes.Equal(out, caPEM) {
			t.Errorf("clade %v: %v %q", args, err, out)
		}
	}
	sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "tlsweb"})
	if err != nil {
		t.Fatal(err)
	}
	startApp(t, c, sb.ID)
	tg := newTLSTarget(t, sb, appPort, caPEM)
	h2, h1 := tg.client(t, true, tg.roots), tg.client(t, false, tg.roots)

	t.Run("HTTP/2 negotiated", func(t *testing.T) {
		resp, body := tg.do(t, h2, "GET", "/hello", nil)
		if resp.StatusCode != 200 || body != "hello from tlsweb" || resp.ProtoMajor != 2 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
			t.Fatalf("%d %q proto %s tls %+v", resp.StatusCode, body, resp.Proto, resp.TLS)
		}
		// A body goes up, the app sees https as the client's scheme.
		resp, body = tg.do(t, h2, "POST", "/", bytes.NewReader(make([]byte, 3<<20)))
		if resp.StatusCode != 200 || body != strconv.Itoa(3<<20) {
			t.Fatalf("POST: %d %q", resp.StatusCode, body)
		}
		resp, body = tg.do(t, h2, "GET", "/headers", nil)
		if resp.StatusCode != 200 || !strings.Contains(body, "x-forwarded-proto: https\n") || strings.Contains(strings.ToLower(body), "traffic-token") {
			t.Fatalf("headers: %d %q", resp.StatusCode, body)
		}
	})
	t.Run("HTTP/1.1", func(t *testing.T) {
		resp, body := tg.do(t, h1, "GET", "/hello", nil)
		if resp.StatusCode != 200 || body != "hello from tlsweb" || resp.ProtoMajor != 1 {
			t.Fatalf("%d %q proto %s", resp.StatusCode, body, resp.Proto)
		}
		resp, body = tg.do(t, h1, "GET", "/big?n=5000000", nil)
		if resp.StatusCode != 200 || len(body) != 5000000 {
			t.Fatalf("big: %d %d bytes", resp.StatusCode, len(body))
		}
	})
	t.Run("untrusted without the CA", func(t *testing.T) {
		_, err := tg.client(t, true, x509.NewCertPool()).Get(tg.base + "/hello")
		var ua x509.UnknownAuthorityError
		if !errors.As(err, &ua) {
			t.Fatalf("without the CA: %v, want an unknown authority", err)
		}
	})
	t.Run("a sandbox that does not exist or was removed is E2B's 502", func(t *testing.T) {
		gone1, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		g := newTLSTarget(t, gone1, appPort, caPEM)
		if err := c.DeleteSandbox(ctx, gone1.ID); err != nil {
			t.Fatal(err)
		}
		nope := *tg
		nope.base = strings.Replace(tg.base, sb.ID, "nosuchbox", 1)
		for _, x := range []struct {
			tg  *tlsTarget
			ref string
		}{{&nope, "nosuchbox"}, {g, gone1.ID}} {
			for _, hc := range []*http.Client{h2, h1} {
				resp, body := x.tg.do(t, hc, "GET", "/", nil)
				if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" || strings.TrimSpace(body) != gone(x.ref) {
					t.Errorf("%s over %s: %d %q", x.ref, resp.Proto, resp.StatusCode, body)
				}
			}
		}
	})
	t.Run("the CA outlives a restart", func(t *testing.T) {
		d.Stop()
		d.Start(nil)
		again, err := c.IngressCA(ctx)
		if err != nil || !bytes.Equal(again, caPEM) {
			t.Fatalf("after a restart: %v, same CA %v", err, bytes.Equal(again, caPEM))
		}
		sb2, err := c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		tg2 := newTLSTarget(t, sb2, appPort, caPEM)
		if resp, body := tg2.do(t, tg2.client(t, true, tg2.roots), "GET", "/hello", nil); resp.StatusCode != 200 || body != "hello from tlsweb" {
			t.Fatalf("after a restart: %d %q", resp.StatusCode, body)
		}
	})
}

// testCert makes a CA and a certificate it signs for *.domain, written as
// PEM files in dir; it returns their paths and the CA's PEM.
func testCert(t *testing.T, dir, domain string) (certFile, keyFile string, caPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + domain}, DNSNames: []string{"*." + domain},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "ingress.crt"), filepath.Join(dir, "ingress.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

func TestIngressTLSCertFlags(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	certFile, keyFile, caPEM := testCert(t, dir, "clade.test")

	t.Run("bad flags are refused at once", func(t *testing.T) {
		clade, _ := testenv.Binaries(t)
		base := []string{"daemon", "--data-dir", filepath.Join(dir, "data"), "--socket", filepath.Join(dir, "s.sock"), "--ingress", "127.0.0.1:0", "--ingress-domain", "clade.test"}
		for _, x := range []struct {
			args []string
			want string
		}{
			{[]string{"--ingress-tls-cert", certFile}, "go together"},
			{[]string{"--ingress-tls-key", keyFile}, "go together"},
			{[]string{"--ingress-tls-cert", filepath.Join(dir, "nope.crt"), "--ingress-tls-key", keyFile}, "nope.crt"},
			{[]string{"--ingress-tls-cert", certFile, "--ingress-tls-key", dir}, "is a directory"},
			{[]string{"--ingress-tls-cert", keyFile, "--ingress-tls-key", certFile}, "PEM"},
		} {
			out, err := exec.Command(clade, append(base, x.args...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), x.want) {
				t.Errorf("%v: %v %q, want an error with %q", x.args, err, out, x.want)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused start made its data dir: %v", err)
		}
	})

	d := startDaemon(t, "--ingress-tls-cert", certFile, "--ingress-tls-key", keyFile)
	c := d.Client
	ctx := t.Context()
	if _, err := c.IngressCA(ctx); !sdk.IsNotFound(err) {
		t.Errorf("IngressCA with a given certificate: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(d.DataDir, ingress.CAFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a CA was made beside a given certificate: %v", err)
	}
	sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "given"})
	if err != nil {
		t.Fatal(err)
	}
	startApp(t, c, sb.ID)
	tg := newTLSTarget(t, sb, appPort, caPEM)
	resp, body := tg.do(t, tg.client(t, true, tg.roots), "GET", "/hello", nil)
	if resp.StatusCode != 200 || body != "hello from given" || resp.ProtoMajor != 2 {
		t.Fatalf("%d %q %s", resp.StatusCode, body, resp.Proto)
	}
}
