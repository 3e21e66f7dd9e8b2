package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// stallProxy is a TCP proxy in front of the S3 server that the test can
// stall: a stalled proxy accepts connections and reads requests but
// forwards nothing either way (a hung S3 endpoint), until it is let go.
type stallProxy struct {
	ln net.Listener
	up string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool             // guarded by mu
	conns   map[net.Conn]int // guarded by mu
}

func startStallProxy(t *testing.T, at, upstream string) *stallProxy {
	ln, err := net.Listen("tcp", net.JoinHostPort(at, "0"))
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, up: upstream, conns: map[net.Conn]int{}}
	p.cond = sync.NewCond(&p.mu)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		p.Stall(false)
		_ = ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.serve(c)
			}()
		}
	}()
	return p
}

func (p *stallProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c]++
	} else {
		delete(p.conns, c)
	}
}

// Stall stops (on) or lets go (off) everything through the proxy.
func (p *stallProxy) Stall(on bool) {
	p.mu.Lock()
	p.stalled = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *stallProxy) wait() {
	p.mu.Lock()
	for p.stalled {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

func (p *stallProxy) serve(c net.Conn) {
	p.track(c, true)
	defer p.track(c, false)
	defer c.Close()
	p.wait()
	u, err := net.Dial("tcp", p.up)
	if err != nil {
		return
	}
	p.track(u, true)
	defer p.track(u, false)
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.wait()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
		}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	<-done
}

// TestNetClusterDrain is issue 25's drain of a node with running
// sandboxes, on three daemons sharing a real S3 store (SeaweedFS behind a
// TCP proxy the test can stall): `clade node drain n1` moves an idle
// running sandbox (slept, given away, woken at once on its new node: its
// process counts on, its file is there) and a sleeping one (given away,
// still asleep), shows its progress, and lists the busy one (an exec in
// flight) as what holds the drain; once idle, that one moves too. Then a
// node whose --max-memory is below a sandbox given to it refuses to adopt
// it and the record goes to another node; and an adopt whose fetch the
// stalled store hangs gives up at --cluster-move-timeout with a
// retryable 503, the sandbox still asleep, and works once the store
// answers.
func TestNetClusterDrain(t *testing.T) {
	creds := filepath.Join(testenv.TempDir(t), "creds")
	var w snapstore.S3Config
	var proxy *stallProxy
	const moveTimeout = 5 * time.Second
	c := testenv.StartNetClusterWith(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s",
		"--cluster-move-timeout", moveTimeout.String()}, nil, func(br netip.Addr) []string {
		srv := weedtest.StartAt(t, br.String())
		w = srv.Config("clade-drain")
		st, err := snapstore.NewS3(t.Context(), w)
		if err == nil {
			err = st.Probe(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(creds, fmt.Appendf(nil, "AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", w.AccessKey, w.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		proxy = startStallProxy(t, br.String(), strings.TrimPrefix(srv.Endpoint, "http://"))
		return []string{"--object-store", "s3://clade-drain?endpoint=http://" + proxy.ln.Addr().String(), "--object-store-credentials", creds}
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n2.Etcd, n3.Etcd, n1.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	record := func(id string) dirRecord {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var rec dirRecord
		if r, err := cli.Get(ctx, "/clade/sandboxes/"+id); err == nil && len(r.Kvs) > 0 {
			_ = json.Unmarshal(r.Kvs[0].Value, &rec)
		}
		return rec
	}
	s3, err := snapstore.NewS3(t.Context(), w)
	if err != nil {
		t.Fatal(err)
	}
	sleepWithImage := func(nd *testenv.NetNode, id string) dirRecord {
		t.Helper()
		if _, err := nd.Client.Sleep(t.Context(), id); err != nil {
			t.Fatalf("sleep through %s: %v", nd.Name, err)
		}
		var rec dirRecord
		waitFor(t, 2*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
			rec = record(id)
			if rec.State != "sleeping" || rec.SleepImage == "" {
				return false, fmt.Sprintf("%+v", rec)
			}
			has, err := snapstore.Has(t.Context(), s3, snapstore.Digest(rec.SleepImage))
			return has, fmt.Sprintf("%+v in the store: %v %v", rec, has, err)
		})
		return rec
	}
	create := func(node string, mib int) string {
		t.Helper()
		sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: node, MemoryMiB: mib})
		if err != nil || sb.Node != node {
			t.Fatalf("create on %s: %+v %v", node, sb, err)
		}
		return sb.ID
	}

	// On n1: an idle running sandbox with a file and a counting process,
	// a busy one (an exec in flight), one the user put to sleep.
	idle, busy, asleep := create("n1", 0), create("n1", 0), create("n1", 0)
	shOn(t, n1, idle, `echo drained-file > /root/hello
setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /root/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null &
sleep 0.5; cat /root/count`)
	sleepWithImage(n1, asleep)
	execCtx, endExec := context.WithCancel(t.Context())
	defer endExec()
	pr, pw := io.Pipe()
	execDone := make(chan error, 1)
	go func() {
		_, err := n1.Client.Exec(execCtx, busy, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo started; exec sleep 600"}, Stdout: pw})
		_ = pw.CloseWithError(err)
		execDone <- err
	}()
	if l, err := bufio.NewReader(pr).ReadString('\n'); err != nil || strings.TrimSpace(l) != "started" {
		t.Fatalf("the busy sandbox's exec: %q %v", l, err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	before, _ := strconv.Atoi(shOn(t, n1, idle, "cat /root/count"))

	// clade node drain n1 follows the drain until only the busy one
	// holds it.
	t0 := time.Now()
	out, err := exec.Command(n1.Bin, "--host", n1.Socket, "node", "drain", "n1", "--wait", "5m").CombinedOutput()
	took := time.Since(t0)
	t.Logf("clade node drain n1 (%s):\n%s", took.Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("clade node drain n1: %v", err)
	}
	if !strings.Contains(string(out), " moved, ") || !strings.Contains(string(out), "holding the drain") ||
		!strings.Contains(string(out), busy) || !strings.Contains(string(out), "busy: 1 exec") ||
		strings.Contains(string(out), idle) || strings.Contains(string(out), asleep) {
		t.Fatalf("clade node drain n1 does not show the progress and the busy sandbox (alone) holding it:\n%s", out)
	}
	r := record(idle)
	if r.Node == "n1" || r.State != "running" {
		t.Fatalf("the idle running sandbox after the drain: %+v, want running on another node", r)
	}
	to := c.Nodes[map[string]int{"n2": 1, "n3": 2}[r.Node]]
	if f := shOn(t, n3, idle, "cat /root/hello"); f != "drained-file" {
		t.Fatalf("the file after the drain's move: %q", f)
	}
	after, _ := strconv.Atoi(shOn(t, to, idle, "cat /root/count"))
	if after < before {
		t.Fatalf("count %d after the move, %d before: the process did not go on from where it was", after, before)
	}
	waitFor(t, 30*time.Second, "the count goes on", func() (bool, string) {
		n, _ := strconv.Atoi(shOn(t, to, idle, "cat /root/count"))
		return n > after, strconv.Itoa(n)
	})
	if r := record(asleep); r.Node == "n1" || r.State != "sleeping" {
		t.Fatalf("the sleeping sandbox after the drain: %+v, want asleep on another node", r)
	}
	if r := record(busy); r.Node != "n1" || r.State != "running" {
		t.Fatalf("the busy sandbox during the drain: %+v, want running on n1", r)
	}
	t.Logf("moved %s to %s running (count %d -> %d) and %s asleep; %s held", idle, r.Node, before, after, asleep, busy)

	// The exec ends: the busy one is idle and moves too; n1 is empty.
	endExec()
	<-execDone
	waitFor(t, 3*time.Minute, "the once busy sandbox moves off n1", func() (bool, string) {
		r := record(busy)
		return r.Node != "n1" && r.State == "running", fmt.Sprintf("%+v", r)
	})
	waitFor(t, time.Minute, "n1's drain shows nothing left", func() (bool, string) {
		ns, err := n3.Client.ListNodes(t.Context())
		if err != nil {
			return false, err.Error()
		}
		d := ns[0].Drain
		return d != nil && d.Moved >= 2 && d.Running+d.Sleeping == 0 && len(d.Held) == 0, fmt.Sprintf("%+v", d)
	})
	if _, err := n1.Client.UndrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{idle, busy, asleep} {
		if err := n2.Client.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}

	// A sandbox of 1024 MiB given to n1, which is then restarted with
	// --max-memory 768: n1 refuses to adopt it and gives it to n3.
	big := create("n2", 1024)
	sleepWithImage(n2, big)
	if _, err := n1.Client.DrainNode(t.Context(), "n3"); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Client.DrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	if r := record(big); r.Node != "n1" || r.State != "sleeping" {
		t.Fatalf("the big sandbox after n2's drain: %+v, want given to n1", r)
	}
	n1.Stop()
	n1.SetArgs("--max-memory", "768")
	c.Restart(0)
	if _, err := n1.Client.UndrainNode(t.Context(), "n3"); err != nil {
		t.Fatal(err)
	}
	woke, err := n1.Client.Wake(t.Context(), big)
	if err != nil || woke.Node != "n3" || woke.State != "running" {
		t.Fatalf("wake through n1 (--max-memory 768) of a 1024 MiB sandbox given to it: %+v %v, want running on n3", woke, err)
	}
	if !strings.Contains(n1.Log(), "--max-memory") {
		t.Errorf("n1's log does not say why it refused the sandbox")
	}
	if r := record(big); r.Node != "n3" || r.State != "running" {
		t.Fatalf("the big sandbox's record: %+v", r)
	}
	t.Logf("n1 (--max-memory 768) refused to adopt %s (1024 MiB); it woke on n3", big)
	if _, err := n1.Client.UndrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	n1.Stop()
	n1.SetArgs("--max-memory", "0")
	c.Restart(0)

	// The store hangs mid-move: the adopt gives up at the timeout, the
	// sandbox stays asleep, the caller gets a retryable 503; with the
	// store back, the next wake moves it.
	hung := create("n2", 0)
	shOn(t, n2, hung, "echo hung-file > /root/f")
	sleepWithImage(n2, hung)
	if _, err := n2.Client.DrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	given := record(hung)
	if given.Node == "n2" || given.State != "sleeping" {
		t.Fatalf("after n2's drain: %+v", given)
	}
	x := c.Nodes[map[string]int{"n1": 0, "n3": 2}[given.Node]]
	proxy.Stall(true)
	t0 = time.Now()
	_, err = x.Client.Wake(t.Context(), hung)
	took = time.Since(t0)
	proxy.Stall(false)
	var ae *sdk.Error
	if !sdk.IsUnavailable(err) || !errors.As(err, &ae) || !strings.Contains(err.Error(), "--cluster-move-timeout") || !strings.Contains(err.Error(), "stays asleep") {
		t.Fatalf("wake through %s with the store hung: %v, want a retryable 503 saying the move timed out", x.Name, err)
	}
	if took < moveTimeout || took > moveTimeout+time.Minute {
		t.Fatalf("the hung move answered after %s (timeout %s)", took, moveTimeout)
	}
	if r := record(hung); r.State != "sleeping" || r.Node != x.Name || r.SleepImage != given.SleepImage {
		t.Fatalf("the record after the timed-out move: %+v, want asleep on %s with its image", r, x.Name)
	}
	t.Logf("the hung store's move through %s gave up after %s: %v", x.Name, took.Round(time.Millisecond), err)
	woke, err = x.Client.Wake(t.Context(), hung)
	if err != nil || woke.Node != x.Name || woke.State != "running" {
		t.Fatalf("wake through %s with the store back: %+v %v", x.Name, woke, err)
	}
	if f := shOn(t, n2, hung, "cat /root/f"); f != "hung-file" {
		t.Fatalf("the file after the move: %q", f)
	}
	if _, err := n2.Client.UndrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
}
