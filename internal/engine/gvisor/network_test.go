package gvisor_test

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/engine/enginetest"
	"github.com/clade-sandbox/clade/internal/engine/gvisor"
	"github.com/clade-sandbox/clade/internal/network"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// fetchPy prints the body of URL argv[1] or the error's class.
const fetchPy = `import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as e:
    print("ERR", type(e).__name__, e)
`

// TestSandboxNetwork: a sandbox in a slot's namespace has the slot's
// address, reaches an allowed test host by name through the slot's
// resolver, and a checkpoint restored into another slot answers on that
// slot's address.
func TestSandboxNetwork(t *testing.T) {
	runsc := testenv.Runsc(t)
	images := testenv.ImagesDir(t)
	_, agent := testenv.Binaries(t)
	p := testenv.ReserveNet(t)
	host := testenv.StartTestHost(t, p)
	ctx := t.Context()
	n, err := network.New(ctx, network.Config{StateDir: t.TempDir(), Range: p.Range, Prefix: p.Prefix, PoolSize: 2, Upstreams: []string{host.DNS}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Reclaim(context.Background(), nil)
		_ = n.Close()
		if leaks := p.NetLeaks(); len(leaks) > 0 {
			t.Errorf("leaked: %v", leaks)
		}
	})
	dir := testenv.TempDir(t)
	e, err := gvisor.New(gvisor.Config{StateDir: dir, Runsc: runsc, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(images, "default", "rootfs")
	start := func(id string, restoreFrom string) engine.Sandbox {
		t.Helper()
		s, err := n.Acquire(ctx, id, network.Policy{Allow: []string{"good.test"}})
		if err != nil {
			t.Fatal(err)
		}
		spec := engine.Spec{ID: id, RootFS: rootfs, MemoryMiB: 256, CPUs: 1, Hostname: "net", NetNS: s.NetNS, DNS: []string{s.Resolver.String()}}
		var sb engine.Sandbox
		if restoreFrom == "" {
			sb, err = e.Create(ctx, spec)
		} else {
			sb, err = e.Restore(ctx, spec, restoreFrom)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Destroy(context.Background(), id); _ = n.Release(context.Background(), id) })
		return sb
	}
	parent := start("netparent0000001", "")
	if r := enginetest.Exec(t, parent, "python3", "-c", fetchPy, "http://good.test/"); strings.TrimSpace(r.Stdout) != "hello from "+host.Addr.String() {
		t.Fatalf("fetch good.test: %+v", r)
	}
	if r := enginetest.Exec(t, parent, "python3", "-c", fetchPy, "http://"+host.Addr2.String()+"/"); !strings.HasPrefix(r.Stdout, "ERR") {
		t.Fatalf("fetch of an address no allowed name resolved to: %+v", r)
	}
	// A server in the parent, then a checkpoint restored into another slot.
	if r := enginetest.Exec(t, parent, "sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 & python3 -c \"$0\"", waitPortPy); r.Exit.Code != 0 {
		t.Fatalf("start server: %+v", r)
	}
	if body := dialGet(t, n, "netparent0000001", 8000); !strings.Contains(body, "Directory listing") {
		t.Fatalf("parent's server from the host: %q", body)
	}
	img := filepath.Join(dir, "ckpt")
	if err := e.Checkpoint(ctx, "netparent0000001", img, true); err != nil {
		t.Fatal(err)
	}
	child := start("netchild00000001", img)
	cs, _ := n.Lookup("netchild00000001")
	ps, _ := n.Lookup("netparent0000001")
	if cs.Addr == ps.Addr {
		t.Fatal("child and parent share an address")
	}
	if body := dialGet(t, n, "netchild00000001", 8000); !strings.Contains(body, "Directory listing") {
		t.Fatalf("restored server on the child's address %s: %q", cs.Addr, body)
	}
	if r := enginetest.Exec(t, child, "python3", "-c", fetchPy, "http://good.test/"); strings.TrimSpace(r.Stdout) != "hello from "+host.Addr.String() {
		t.Fatalf("child fetch good.test: %+v", r)
	}
}

// waitPortPy polls until port 8000 accepts.
const waitPortPy = `import socket, time
for i in range(400):
    try:
        socket.create_connection(("127.0.0.1", 8000)).close()
        break
    except OSError:
        time.sleep(0.025)
`

// dialGet sends a GET / to port in owner's slot from the host.
func dialGet(t *testing.T, n *network.Network, owner string, port int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := n.Dial(ctx, owner, port)
	if err != nil {
		t.Fatalf("dial %s:%d: %v", owner, port, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}
