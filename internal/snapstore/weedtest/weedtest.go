// Package weedtest starts a real S3-compatible server for tests: SeaweedFS's
// weed (bin/weed, built by `make deps-weed` from the version tools/weed
// pins) with its S3 gateway, on loopback ports of its own, in a scratch dir.
package weedtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// Server is a running weed.
type Server struct {
	// Endpoint is the S3 gateway's URL (http://IP:PORT).
	Endpoint             string
	AccessKey, SecretKey string
}

// Config returns a config for a bucket of its own on s (made on first use).
func (s *Server) Config(bucket string) snapstore.S3Config {
	return snapstore.S3Config{Endpoint: s.Endpoint, Bucket: bucket, AccessKey: s.AccessKey, SecretKey: s.SecretKey, CreateBucket: true}
}

// Binary returns bin/weed, failing the test (never skipping it) when it
// is not built.
func Binary(t testing.TB) string {
	t.Helper()
	p := filepath.Join(testenv.ModuleRoot(), "bin", "weed")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found: run `make deps-weed` (the object store tests need a real S3 server)", p)
	}
	return p
}

// Start starts a weed server on loopback for the test and stops it at its
// end.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartAt(t, "127.0.0.1")
}

// StartAt starts a weed server listening on ip only (an address of the
// test's own, e.g. the bridge of testenv.StartNetCluster, which its
// nodes' namespaces reach) and stops it at the test's end.
func StartAt(t testing.TB, ip string) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	ports := freePorts(t, ip, 8)
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	s := &Server{Endpoint: "http://" + net.JoinHostPort(ip, strconv.Itoa(ports[6])), AccessKey: "clade" + hex.EncodeToString(key[:4]), SecretKey: hex.EncodeToString(key)}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	// The smallest setup with an S3 gateway: master, volume, filer, s3 in
	// one process, every port given (the defaults are fixed numbers, and
	// each gRPC port would be its HTTP port + 10000), nothing else on,
	// telemetry off (no traffic leaves loopback).
	args := []string{"server",
		"-ip=" + ip, "-ip.bind=" + ip, "-dir=" + dir,
		"-master.port=" + p(0), "-master.port.grpc=" + p(1), "-master.telemetry=false",
		"-master.volumeSizeLimitMB=256",
		"-volume.port=" + p(2), "-volume.port.grpc=" + p(3), "-volume.max=0",
		"-filer", "-filer.port=" + p(4), "-filer.port.grpc=" + p(5), "-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port=" + p(6), "-s3.port.grpc=" + p(7), "-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
	}
	logPath := filepath.Join(dir, "weed.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// The S3 gateway makes an admin identity of these.
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s.AccessKey, "AWS_SECRET_ACCESS_KEY="+s.SecretKey, "HOME="+dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Killed, not stopped: its data goes with the test's dir, and
		// weed's own stop (SIGTERM) takes 20-30 s here, which every test
		// sat out (it was cut at 10 s).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		logf.Close()
	})
	fail := func(format string, args ...any) {
		b, _ := os.ReadFile(logPath)
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Fatalf("weed: "+format+"\n--- weed log (tail) ---\n%s", append(args, b)...)
	}
	// Ready once a bucket can be made and an object written through S3
	// (the gateway answers before the filer has a volume to write to).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		select {
		case err := <-exited:
			fail("exited before it was ready: %v", err)
		default:
		}
		if last = probe(ctx, s); last == nil {
			return s
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // polling a server's readiness
		}
	}
	fail("not ready after 90 s: %v", last)
	return nil
}

func probe(ctx context.Context, s *Server) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := snapstore.NewS3(pctx, s.Config("ready"))
	if err != nil {
		return err
	}
	return st.Probe(pctx)
}

// freePorts returns n distinct free loopback ports below 50000 (weed
// refuses gRPC ports it would derive above 65535).
func freePorts(t testing.TB, ip string, n int) []int {
	t.Helper()
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		if p := l.Addr().(*net.TCPAddr).Port; p < 50000 {
			out = append(out, p)
		}
		if len(ls) > 1000 {
			t.Fatal(fmt.Errorf("no free loopback ports below 50000"))
		}
	}
	return out
}
