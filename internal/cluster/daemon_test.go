package cluster_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
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

func listNodes(t *testing.T, c *sdk.Client) []string {
	t.Helper()
	ns, err := c.ListNodes(t.Context())
	if err != nil {
		t.Fatalf("node ls: %v", err)
	}
	var names []string
	for _, n := range ns {
		names = append(names, n.Name)
	}
	return names
}

// TestTwoDaemons runs two real daemons on loopback: one with an embedded
// etcd, one joining it. Both list both nodes; a name taken on one is
// refused on the other; the second finds, execs in and removes a sandbox
// the first holds (proxied); the first's node goes when the second is
// SIGKILLed and its lease lapses.
func TestTwoDaemons(t *testing.T) {
	tok := filepath.Join(testenv.TempDir(t), "token")
	if err := os.WriteFile(tok, []byte("cluster-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	etcdAddr := loopbackAddr(t)
	a := testenv.StartDaemon(t, "--cluster", "embed", "--node", "a", "--listen", loopbackAddr(t), "--token-file", tok,
		"--cluster-listen", etcdAddr, "--cluster-peer-listen", loopbackAddr(t), "--cluster-lease-ttl", "3s")
	b := testenv.StartDaemon(t, "--cluster", "etcd://"+etcdAddr, "--node", "b", "--listen", loopbackAddr(t), "--token-file", tok,
		"--cluster-lease-ttl", "3s")
	for _, d := range []*testenv.Daemon{a, b} {
		if got := listNodes(t, d.Client); len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Fatalf("nodes %v, want [a b]", got)
		}
	}
	ns, _ := a.Client.ListNodes(t.Context())
	if !ns[0].Self || ns[0].Capacity.Cores == 0 || ns[0].Capacity.MemAvailableMiB == 0 || len(ns[0].Capacity.Engines) == 0 || len(ns[0].Capacity.Images) == 0 {
		t.Fatalf("node a: %+v", ns[0])
	}

	sb, err := a.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "web", Node: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "web"}); !sdk.IsConflict(err) {
		t.Fatalf("b created a second sandbox named web: %v", err)
	} else {
		t.Logf("refused on b: %v", err)
	}
	got, err := b.Client.GetSandbox(t.Context(), "web")
	if err != nil || got.ID != sb.ID || got.Node != "a" {
		t.Fatalf("web through b: %+v %v", got, err)
	}
	list, err := b.Client.ListSandboxes(t.Context())
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].Node != "a" {
		t.Fatalf("b's list: %+v %v", list, err)
	}
	var out bytes.Buffer
	st, err := b.Client.Exec(t.Context(), "web", sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo hi from $(hostname)"}, Stdout: &out})
	if err != nil || st.Code != 0 || out.Len() == 0 {
		t.Fatalf("exec through b: %+v %v %q", st, err, out.String())
	}
	t.Logf("exec through b: %q", out.String())
	if err := b.Client.DeleteSandbox(t.Context(), "web"); err != nil {
		t.Fatalf("remove through b: %v", err)
	}
	if _, err := a.Client.GetSandbox(t.Context(), sb.ID); !sdk.IsNotFound(err) {
		t.Fatalf("after its removal through b, a has %s: %v", sb.ID, err)
	}
	// The name is free cluster-wide once its sandbox is gone.
	sb2, err := b.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "web"})
	if err != nil {
		t.Fatalf("web after its removal: %v", err)
	}
	if err := b.Client.DeleteSandbox(t.Context(), sb2.ID); err != nil {
		t.Fatal(err)
	}

	// SIGKILL b: its key goes when its lease lapses.
	b.Kill()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if got := listNodes(t, a.Client); len(got) == 1 && got[0] == "a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still listed 15s after it was killed: %v", listNodes(t, a.Client))
		}
		select {
		case <-t.Context().Done():
			return
		case <-time.After(200 * time.Millisecond): // polling etcd's lease expiry
		}
	}
	// Restarted on its data dir, b is back (and its network share is
	// cleaned by its own shutdown at the end).
	b.Start(nil)
	if got := listNodes(t, a.Client); len(got) != 2 {
		t.Fatalf("after b's restart, nodes %v, want [a b]", got)
	}
}

// TestNotACluster: a daemon without --cluster has no nodes to list and
// refuses the cluster flags without --cluster.
func TestNotACluster(t *testing.T) {
	d := testenv.StartDaemon(t)
	if _, err := d.Client.ListNodes(t.Context()); !sdk.IsInvalidArgument(err) {
		t.Fatalf("node ls on a daemon of its own: %v, want invalid_argument", err)
	}
	for _, args := range [][]string{{"--node", "a"}, {"--cluster", "bogus"}, {"--cluster", "embed", "--cluster-lease-ttl", "1s"}} {
		out, err := exec.Command(d.Bin, append([]string{"daemon", "--data-dir", testenv.TempDir(t)}, args...)...).CombinedOutput()
		if err == nil {
			t.Errorf("daemon %v started", args)
		}
		t.Logf("daemon %v: %s", args, bytes.TrimSpace(out))
	}
}
