package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// TestNetClusterDrainParallel is issue 25's drain of a node of many idle
// running sandboxes, on three daemons sharing a real S3 store (SeaweedFS
// behind the test's stall proxy): `clade node drain n1` moves them all
// (several at once: the time is logged, docs/benchmarks.md), every
// progress line it prints adds up (moved + left = all of them, moved never
// falls), and each runs on another node with its file. Then a move's
// window in the list: a sandbox given to a node by a drain is listed once,
// asleep on that node, before it is adopted, and once, moving, while the
// stalled store holds its fetch, through every node.
func TestNetClusterDrainParallel(t *testing.T) {
	n := 8
	if v, err := strconv.Atoi(os.Getenv("CLADE_DRAIN_N")); err == nil && v > 0 {
		n = v
	}
	creds := filepath.Join(testenv.TempDir(t), "creds")
	var w snapstore.S3Config
	var proxy *stallProxy
	c := testenv.StartNetClusterWith(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s",
		"--cluster-move-timeout", "3m"}, nil, func(br netip.Addr) []string {
		srv := weedtest.StartAt(t, br.String())
		w = srv.Config("clade-drainpar")
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
		return []string{"--object-store", "s3://clade-drainpar?endpoint=http://" + proxy.ln.Addr().String(), "--object-store-credentials", creds}
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

	// n idle running sandboxes on n1, each with a file of its own.
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 3)
	for i := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
			if err != nil || sb.Node != "n1" {
				errs <- fmt.Errorf("create on n1: %+v %v", sb, err)
				return
			}
			ids[i] = sb.ID
			var out strings.Builder
			st, err := n1.Client.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "echo file-of-" + sb.ID + " > /root/f"}, Stdout: &out, Stderr: &out})
			if err != nil || st.Code != 0 {
				errs <- fmt.Errorf("exec in %s: %v %s", sb.ID, err, out.String())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// clade node drain n1: all of them move; each progress line adds up.
	t0 := time.Now()
	out, err := exec.Command(n1.Bin, "--host", n1.Socket, "node", "drain", "n1", "--wait", "15m").CombinedOutput()
	took := time.Since(t0)
	t.Logf("clade node drain n1 of %d idle running sandboxes: %s\n%s", n, took.Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("clade node drain n1: %v", err)
	}
	line := regexp.MustCompile(`^n1: (\d+) moved, (\d+) left \((\d+) running, (\d+) sleeping\)$`)
	lastMoved, lines := -1, 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		lines++
		moved, _ := strconv.Atoi(m[1])
		left, _ := strconv.Atoi(m[2])
		running, _ := strconv.Atoi(m[3])
		sleeping, _ := strconv.Atoi(m[4])
		if moved+left != n || running+sleeping != left || moved < lastMoved {
			t.Fatalf("progress line %q does not add up (%d sandboxes; moved before %d)", l, n, lastMoved)
		}
		lastMoved = moved
	}
	if lines == 0 || !strings.Contains(string(out), fmt.Sprintf("n1 drained: %d moved, nothing left on it", n)) {
		t.Fatalf("clade node drain n1 does not show its progress and end with all %d moved:\n%s", n, out)
	}
	on := map[string]int{}
	for _, id := range ids {
		r := record(id)
		if r.Node == "n1" || r.State != "running" {
			t.Fatalf("%s after the drain: %+v, want running on another node", id, r)
		}
		on[r.Node]++
		if f := shOn(t, n3, id, "cat /root/f"); f != "file-of-"+id {
			t.Fatalf("%s's file after the move: %q", id, f)
		}
	}
	t.Logf("drained %d idle running sandboxes in %s (%.2f s each): %v", n, took.Round(time.Millisecond), took.Seconds()/float64(n), on)
	if _, err := n1.Client.UndrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := n2.Client.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}

	// A move's window in the list: given to x by n2's drain, not adopted
	// yet; then moving while the stalled store holds x's fetch.
	once := func(nd *testenv.NetNode, id, node, state string) {
		t.Helper()
		sbs, err := nd.Client.ListSandboxes(t.Context())
		if err != nil {
			t.Fatalf("list through %s: %v", nd.Name, err)
		}
		var seen []string
		for _, sb := range sbs {
			if sb.ID == id {
				seen = append(seen, sb.Node+":"+sb.State)
			}
		}
		if len(seen) != 1 || seen[0] != node+":"+state {
			t.Fatalf("the list through %s shows %s as %v, want once as %s:%s", nd.Name, id, seen, node, state)
		}
	}
	sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, n2, sb.ID, "echo window-file > /root/f")
	if _, err := n2.Client.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
		rec := record(sb.ID)
		if rec.State != "sleeping" || rec.SleepImage == "" {
			return false, fmt.Sprintf("%+v", rec)
		}
		has, err := snapstore.Has(t.Context(), s3, snapstore.Digest(rec.SleepImage))
		return has, fmt.Sprintf("%+v in the store: %v %v", rec, has, err)
	})
	if _, err := n1.Client.DrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	given := record(sb.ID)
	if given.Node == "n2" || given.State != "sleeping" {
		t.Fatalf("after n2's drain: %+v", given)
	}
	x := c.Nodes[map[string]int{"n1": 0, "n3": 2}[given.Node]]
	for _, nd := range c.Nodes {
		once(nd, sb.ID, x.Name, "sleeping")
	}
	proxy.Stall(true)
	woke := make(chan error, 1)
	go func() {
		got, err := x.Client.Wake(t.Context(), sb.ID)
		if err == nil && (got.Node != x.Name || got.State != "running") {
			err = fmt.Errorf("woke %+v", got)
		}
		woke <- err
	}()
	waitFor(t, time.Minute, "the record says moving", func() (bool, string) {
		r := record(sb.ID)
		return r.State == "moving", fmt.Sprintf("%+v", r)
	})
	for _, nd := range c.Nodes {
		once(nd, sb.ID, x.Name, "moving")
	}
	proxy.Stall(false)
	if err := <-woke; err != nil {
		t.Fatalf("the wake through %s once the store answers: %v", x.Name, err)
	}
	for _, nd := range c.Nodes {
		once(nd, sb.ID, x.Name, "running")
	}
	if f := shOn(t, n2, sb.ID, "cat /root/f"); f != "window-file" {
		t.Fatalf("the file after the move: %q", f)
	}
	if _, err := n2.Client.UndrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
}

// TestNetClusterDrainRoom: the drain's moves run together, yet two never
// take a node's room for one. n2 and n3 each have room (their overcommit
// cap) for one sandbox of the size the test picks, n1 for many; n1 holds
// three idle ones and is drained: one moves to each of n2 and n3, and the
// third stays on n1, held with the words that no other node has memory
// for it now (before, the drain gave it to a node without room, whose wake
// refused it). Undrained, it runs on n1 again.
func TestNetClusterDrainRoom(t *testing.T) {
	creds := filepath.Join(testenv.TempDir(t), "creds")
	c := testenv.StartNetClusterWith(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, func(i int) []string {
		if i == 0 {
			return []string{"--memory-overcommit", "0"}
		}
		return []string{"--memory-overcommit", "0.1"}
	}, func(br netip.Addr) []string {
		srv := weedtest.StartAt(t, br.String())
		w := srv.Config("clade-drainroom")
		st, err := snapstore.NewS3(t.Context(), w)
		if err == nil {
			err = st.Probe(t.Context()) // makes the bucket
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(creds, fmt.Appendf(nil, "AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", w.AccessKey, w.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--object-store", "s3://clade-drainroom?endpoint=" + srv.Endpoint, "--object-store-credentials", creds}
	})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ns, err := n2.Client.ListNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	room := int64(-1)
	for _, n := range ns {
		if n.Name == "n1" {
			continue
		}
		r := n.Capacity.MemoryLimitMiB - n.Capacity.MemoryAdmittedMiB
		if n.Capacity.MemoryLimitMiB <= 0 || r <= 0 {
			t.Fatalf("node %s has no overcommit cap: %+v", n.Name, n.Capacity)
		}
		if room < 0 || r < room {
			room = r
		}
	}
	size := int(room * 2 / 3) // one fits a node, two do not
	t.Logf("n2 and n3 have room for %d MiB each; sandboxes of %d MiB", room, size)
	var ids []string
	for range 3 {
		sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: size})
		if err != nil || sb.Node != "n1" {
			t.Fatalf("create on n1: %+v %v", sb, err)
		}
		ids = append(ids, sb.ID)
	}
	out, err := exec.Command(n1.Bin, "--host", n1.Socket, "node", "drain", "n1", "--wait", "10m").CombinedOutput()
	t.Logf("clade node drain n1:\n%s", out)
	if err != nil {
		t.Fatalf("clade node drain n1: %v", err)
	}
	if !strings.Contains(string(out), "n1: 2 moved; 1 stay, holding the drain") || !strings.Contains(string(out), "no other node has memory for it now") {
		t.Fatalf("clade node drain n1 does not end with 2 moved and 1 held for room:\n%s", out)
	}
	on := map[string][]string{}
	for _, id := range ids {
		sb, err := n2.Client.GetSandbox(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		on[sb.Node] = append(on[sb.Node], sb.State)
	}
	if len(on["n2"]) != 1 || len(on["n3"]) != 1 || len(on["n1"]) != 1 || on["n2"][0] != "running" || on["n3"][0] != "running" {
		t.Fatalf("after the drain: %v, want one running on each of n2 and n3 and one left on n1", on)
	}
	ns, err = n2.Client.ListNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Name != "n1" && n.Capacity.MemoryAdmittedMiB > n.Capacity.MemoryLimitMiB {
			t.Fatalf("node %s admitted %d MiB over its cap of %d", n.Name, n.Capacity.MemoryAdmittedMiB, n.Capacity.MemoryLimitMiB)
		}
	}
	if _, err := n1.Client.UndrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	left := ""
	for _, id := range ids {
		if sb, err := n2.Client.GetSandbox(t.Context(), id); err == nil && sb.Node == "n1" {
			left = id
		}
	}
	waitFor(t, 2*time.Minute, "the held one runs on n1 again after the undrain", func() (bool, string) {
		sb, err := n2.Client.GetSandbox(t.Context(), left)
		return err == nil && sb.Node == "n1" && sb.State == "running", fmt.Sprintf("%+v %v", sb, err)
	})
	for _, id := range ids {
		if err := n2.Client.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}
}

// TestNetClusterDrainHeldRetried: a sandbox a drain holds for room moves
// as soon as a node has room for it, while the drain's other moves go on.
// n2 and n3 each have room (their overcommit cap) for one sandbox of the
// size the test picks, but n3's is taken by another sandbox; n1 holds two
// idle ones and is drained: one is given to n2, whose fetch of its image
// the test's proxy stalls, and the other is held for room. Once the
// sandbox on n3 is removed, the held one runs on n3 while the first move
// is still stalled (before, it waited for the pass, and so for the stalled
// move, to end), and `clade node drain n1` says so.
func TestNetClusterDrainHeldRetried(t *testing.T) {
	creds := filepath.Join(testenv.TempDir(t), "creds")
	var proxy *stallProxy
	var proxied string
	c := testenv.StartNetClusterWith(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s", "--cluster-move-timeout", "10m"}, func(i int) []string {
		switch i {
		case 0:
			return []string{"--memory-overcommit", "0"}
		case 1: // n2 fetches from the store through the stall proxy
			return []string{"--memory-overcommit", "0.1", "--object-store", proxied}
		}
		return []string{"--memory-overcommit", "0.1"}
	}, func(br netip.Addr) []string {
		srv := weedtest.StartAt(t, br.String())
		w := srv.Config("clade-drainretry")
		st, err := snapstore.NewS3(t.Context(), w)
		if err == nil {
			err = st.Probe(t.Context()) // makes the bucket
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(creds, fmt.Appendf(nil, "AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", w.AccessKey, w.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		proxy = startStallProxy(t, br.String(), strings.TrimPrefix(srv.Endpoint, "http://"))
		proxied = "s3://clade-drainretry?endpoint=http://" + proxy.ln.Addr().String()
		return []string{"--object-store", "s3://clade-drainretry?endpoint=" + srv.Endpoint, "--object-store-credentials", creds}
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
	ns, err := n2.Client.ListNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	room := int64(-1)
	for _, n := range ns {
		if n.Name == "n1" {
			continue
		}
		r := n.Capacity.MemoryLimitMiB - n.Capacity.MemoryAdmittedMiB
		if n.Capacity.MemoryLimitMiB <= 0 || r <= 0 {
			t.Fatalf("node %s has no overcommit cap: %+v", n.Name, n.Capacity)
		}
		if room < 0 || r < room {
			room = r
		}
	}
	size := int(room * 2 / 3) // one fits a node, two do not
	t.Logf("n2 and n3 have room for %d MiB each; sandboxes of %d MiB", room, size)
	filler, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n3", MemoryMiB: size})
	if err != nil || filler.Node != "n3" {
		t.Fatalf("create on n3: %+v %v", filler, err)
	}
	var ids []string
	for range 2 {
		sb, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: size})
		if err != nil || sb.Node != "n1" {
			t.Fatalf("create on n1: %+v %v", sb, err)
		}
		ids = append(ids, sb.ID)
	}

	proxy.Stall(true)
	defer proxy.Stall(false) // a failure's cleanup removes the sandboxes through n2 too
	var out strings.Builder
	cmd := exec.Command(n1.Bin, "--host", n1.Socket, "node", "drain", "n1", "--wait", "15m")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-ended
		}
	}()
	// One given to n2 (its fetch stalled), the other held for room.
	var stalled, held string
	waitFor(t, 3*time.Minute, "one sandbox given to n2 and the other held for room", func() (bool, string) {
		ns, err := n2.Client.ListNodes(t.Context())
		if err != nil {
			return false, err.Error()
		}
		var p *sdk.DrainProgress
		for _, n := range ns {
			if n.Name == "n1" {
				p = n.Drain
			}
		}
		stalled, held = "", ""
		for _, id := range ids {
			if record(id).Node == "n2" {
				stalled = id
			}
		}
		if p != nil {
			for _, h := range p.Held {
				if strings.Contains(h.Why, "no other node has memory for it now") {
					held = h.ID
				}
			}
		}
		return stalled != "" && held != "" && held != stalled, fmt.Sprintf("progress %+v; records %+v %+v", p, record(ids[0]), record(ids[1]))
	})
	t.Logf("given to n2 (stalled): %s; held for room: %s", stalled, held)
	t0 := time.Now()
	if err := n2.Client.DeleteSandbox(t.Context(), filler.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the held sandbox runs on n3 while the other's move is stalled", func() (bool, string) {
		r := record(held)
		return r.Node == "n3" && r.State == "running", fmt.Sprintf("%+v", r)
	})
	t.Logf("the held sandbox ran on n3 %s after n3 had room", time.Since(t0).Round(time.Millisecond))
	if r := record(stalled); r.State == "running" {
		t.Fatalf("the stalled move is done already (%+v): the test shows nothing", r)
	}
	proxy.Stall(false)
	select {
	case err := <-ended:
		t.Logf("clade node drain n1:\n%s", out.String())
		if err != nil {
			t.Fatalf("clade node drain n1: %v", err)
		}
	case <-time.After(10 * time.Minute):
		t.Fatalf("clade node drain n1 has not ended 10 min after the store answers:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "n1: node n3 has room now: moving "+held+", held for room") ||
		!strings.Contains(out.String(), "n1 drained: 2 moved, nothing left on it") {
		t.Fatalf("clade node drain n1 does not say the held one moved once n3 had room, and end with both moved:\n%s", out.String())
	}
	for id, want := range map[string]string{stalled: "n2", held: "n3"} {
		sb, err := n3.Client.GetSandbox(t.Context(), id)
		if err != nil || sb.Node != want || sb.State != "running" {
			t.Fatalf("%s after the drain: %+v %v, want running on %s", id, sb, err, want)
		}
	}
	if _, err := n1.Client.UndrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := n2.Client.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}
}
