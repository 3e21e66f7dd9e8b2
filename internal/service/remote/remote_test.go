package remote_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/service/remote"
	"github.com/clade-sandbox/clade/internal/service/servicetest"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestConformance runs the service suite over the SDK against a real
// daemon (runsc): the remote implementation, and through the daemon's API
// the local one on gVisor.
func TestConformance(t *testing.T) {
	d := testenv.StartDaemon(t)
	svc := remote.New(d.Client, "test-node")
	servicetest.Run(t, func(t *testing.T) servicetest.Env {
		return servicetest.Env{Service: svc, Processes: true}
	})
}

// TestConformanceKept runs the suite's kept commands over the peer-only
// routes: a one-node cluster's daemon (embedded etcd) reached over TCP
// with the cluster token (its API token: no --cluster-token-file), as
// another node of the cluster reaches it. (TestConformance's caller, on
// the unix socket, is refused them: Unauthenticated.)
func TestConformanceKept(t *testing.T) {
	svc := peerService(t)
	servicetest.RunOnly(t, func(t *testing.T) servicetest.Env {
		return servicetest.Env{Service: svc, Processes: true}
	}, "KeptAcrossSleep", "Exec", "ExecStdin")
}

// TestConformancePlain runs the suite's execs as the HTTP API does when it
// relays another node's exec (service.Plain): a plain request per exec on
// the peer's kept-alive connections, its frames relayed (service.Frames)
// or pumped into Stdout and Stderr.
func TestConformancePlain(t *testing.T) {
	svc := peerService(t)
	servicetest.RunOnly(t, func(t *testing.T) servicetest.Env {
		return servicetest.Env{Service: svc, Processes: true, Plain: true}
	}, "Exec")
}

// peerService is the remote service of a one-node cluster's daemon
// (embedded etcd) reached over TCP with the cluster token (its API
// token: no --cluster-token-file), as another node of the cluster
// reaches it.
func peerService(t *testing.T) *remote.Service {
	t.Helper()
	dir := testenv.TempDir(t)
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("peer-"+filepath.Base(dir)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := loopbackAddr(t)
	testenv.StartDaemon(t, "--cluster", "embed", "--node", "k1", "--listen", addr, "--token-file", tok,
		"--cluster-listen", loopbackAddr(t), "--cluster-peer-listen", loopbackAddr(t))
	b, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.New("http://"+addr, sdk.WithToken(string(b[:len(b)-1])))
	if err != nil {
		t.Fatal(err)
	}
	return remote.New(c, "k1")
}

func loopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
