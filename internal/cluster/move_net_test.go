package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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

// dirRecord is what the test reads of a directory record in etcd.
type dirRecord struct {
	Node       string `json:"node"`
	State      string `json:"state"`
	Epoch      int64  `json:"epoch"`
	SleepImage string `json:"sleep_image"`
}

// TestNetClusterMove is issue 25's sleep and wake anywhere, on three
// daemons in network namespaces sharing a real S3 store (SeaweedFS on the
// test's bridge): a sandbox with a file and a counting process sleeps on
// n1, n1 is SIGKILLed, and a request through n3's ingress wakes it on the
// node placement picks, its file there and its process counting on from
// where it was; a restarted n1 removes its stale copy and leaves the
// object store alone; concurrent wakes through two nodes move it once; a
// node killed mid-move leaves nothing half made and a later wake works.
func TestNetClusterMove(t *testing.T) {
	var w *snapstore.S3Config
	creds := filepath.Join(testenv.TempDir(t), "creds")
	var bridge netip.Addr
	const ingressPort = 8080
	// A longer lease than the harness's 2 s: on a loaded host a live node's lease
	// must not lapse (its running sandbox would be marked lost).
	c := testenv.StartNetClusterWith(t, 3, []string{"--pressure-floor", "-1", "--ingress-domain", "clade.test", "--cluster-lease-ttl", "5s"}, func(i int) []string {
		a := bridge.As4()
		a[3] = byte(10 + i + 1)
		return []string{"--ingress", netip.AddrPortFrom(netip.AddrFrom4(a), ingressPort).String()}
	}, func(br netip.Addr) []string {
		bridge = br
		srv := weedtest.StartAt(t, br.String())
		cfg := srv.Config("clade-move")
		w = &cfg
		// The bucket is made here: a daemon refuses a store without it.
		st, err := snapstore.NewS3(t.Context(), cfg)
		if err == nil {
			err = st.Probe(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(creds, fmt.Appendf(nil, "AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", cfg.AccessKey, cfg.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--object-store", "s3://clade-move?endpoint=" + srv.Endpoint, "--object-store-credentials", creds}
	})
	n1, n3 := c.Nodes[0], c.Nodes[2]
	byName := map[string]int{}
	for i, nd := range c.Nodes {
		byName[nd.Name] = i
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Nodes[1].Etcd, c.Nodes[2].Etcd, n1.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	record := func(id string) (dirRecord, bool) {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		r, err := cli.Get(ctx, "/clade/sandboxes/"+id)
		if err != nil || len(r.Kvs) == 0 {
			return dirRecord{}, false
		}
		var rec dirRecord
		return rec, json.Unmarshal(r.Kvs[0].Value, &rec) == nil
	}
	s3, err := snapstore.NewS3(t.Context(), *w)
	if err != nil {
		t.Fatal(err)
	}
	sleepWithImage := func(nd *testenv.NetNode, id string) dirRecord {
		t.Helper()
		if _, err := nd.Client.Sleep(t.Context(), id); err != nil {
			t.Fatalf("sleep through %s: %v", nd.Name, err)
		}
		var rec dirRecord
		// The record is written from the node's events, a moment after
		// the call: until then it may still show the last sleep's image
		// (deleted by the wake since).
		waitFor(t, 2*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
			r, ok := record(id)
			rec = r
			if !ok || r.State != "sleeping" || r.SleepImage == "" {
				return false, fmt.Sprintf("%+v", r)
			}
			has, err := snapstore.Has(t.Context(), s3, snapstore.Digest(r.SleepImage))
			return has, fmt.Sprintf("%+v in the store: %v %v", r, has, err)
		})
		return rec
	}
	// ingressGet is GET path through node nd's ingress for port 8000 of id.
	ingressGet := func(nd *testenv.NetNode, id, path string) (int, string) {
		t.Helper()
		addr := netip.AddrPortFrom(nd.Addr, ingressPort).String()
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}}
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://8000-"+id+".clade.test"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("GET %s through %s's ingress: %v", path, nd.Name, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	moves := func(nd *testenv.NetNode, id string) int {
		n := 0
		for _, l := range strings.Split(nd.Log(), "\n") {
			if strings.Contains(l, "sleeping sandbox moved here") && strings.Contains(l, id) {
				n++
			}
		}
		return n
	}
	sleepDirOf := func(nd *testenv.NetNode, id string) []string {
		var found []string
		_ = filepath.WalkDir(nd.DataDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && filepath.Base(filepath.Dir(p)) == "sleep" && strings.Contains(d.Name(), id) {
				found = append(found, p)
			}
			return nil
		})
		return found
	}

	// A sandbox on n1 with a file, a counting process and a server.
	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", Public: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	shOn(t, n1, id, `echo moved-file > /tmp/hello; mkdir -p /tmp/www; cd /tmp/www
setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/www/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null &
setsid python3 -m http.server 8000 --bind 127.0.0.1 -d /tmp/www >/dev/null 2>&1 </dev/null &
for i in $(seq 200); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000)).close()' 2>/dev/null && exit 0; sleep 0.05; done; exit 1`)
	if code, body := ingressGet(n1, id, "/count"); code != 200 {
		t.Fatalf("n1's ingress before the sleep: %d %s", code, body)
	}
	rec := sleepWithImage(n1, id)
	before, _ := strconv.Atoi(shOn(t, n1, id, "cat /tmp/www/count")) // wakes it on n1 (a local wake)
	if before <= 0 {
		t.Fatalf("count %d before the move", before)
	}
	rec = sleepWithImage(n1, id)
	t.Logf("asleep on n1 at epoch %d, image %s, count %d", rec.Epoch, rec.SleepImage, before)

	// n1 dies; a request through n3's ingress wakes it elsewhere.
	c.Kill(0)
	waitFor(t, time.Minute, "n1 leaves the cluster", func() (bool, string) {
		ok, names := nodeNames(t, n3.Client)
		return ok && names == "n2,n3", names
	})
	t0 := time.Now()
	code, body := ingressGet(n3, id, "/count")
	took := time.Since(t0)
	if code != 200 {
		t.Fatalf("GET through n3's ingress after n1 died: %d %s", code, body)
	}
	got, _ := strconv.Atoi(body)
	if got < before {
		t.Fatalf("the count is %d after the move, %d before: the process did not go on from where it was", got, before)
	}
	moved, ok := record(id)
	if !ok || moved.Node == "n1" || moved.State != "running" || moved.Epoch <= rec.Epoch {
		t.Fatalf("record after the move: %+v (before: %+v)", moved, rec)
	}
	t.Logf("woken on %s through n3's ingress in %s (count %d -> %d), epoch %d", moved.Node, took.Round(time.Millisecond), before, got, moved.Epoch)
	holder := c.Nodes[byName[moved.Node]]
	if f := shOn(t, n3, id, "cat /tmp/hello"); f != "moved-file" {
		t.Fatalf("the file after the move: %q", f)
	}
	waitFor(t, 30*time.Second, "the count goes on", func() (bool, string) {
		n, _ := strconv.Atoi(shOn(t, holder, id, "cat /tmp/www/count"))
		return n > got, strconv.Itoa(n)
	})
	for _, nd := range c.Nodes[1:] {
		sbs, err := nd.Client.ListSandboxes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, s := range sbs {
			if s.ID == id {
				seen++
				if s.Node != moved.Node || s.State != "running" {
					t.Errorf("ls through %s: %s on %s %s, want on %s running", nd.Name, id, s.Node, s.State, moved.Node)
				}
			}
		}
		if seen != 1 {
			t.Errorf("ls through %s lists %s %d times", nd.Name, id, seen)
		}
	}
	if m := moves(holder, id); m != 1 {
		t.Fatalf("%s logged %d moves of %s, want 1", holder.Name, m, id)
	}

	// It sleeps on its new node; n1 comes back and removes its stale
	// copy, leaving the object store's copy, which the holder uses.
	again := sleepWithImage(holder, id)
	if len(sleepDirOf(n1, id)) == 0 {
		t.Fatalf("n1's stale sleep image is not on its disk before its restart: the check below proves nothing")
	}
	c.Restart(0)
	waitFor(t, time.Minute, "n1 removes the copy it no longer holds", func() (bool, string) {
		d := sleepDirOf(n1, id)
		return len(d) == 0, strings.Join(d, ",")
	})
	if r, _ := record(id); r.Node != holder.Name || r.SleepImage != again.SleepImage {
		t.Fatalf("record after n1's restart: %+v, want on %s with image %s", r, holder.Name, again.SleepImage)
	}
	if ok, err := snapstore.Has(t.Context(), s3, snapstore.Digest(again.SleepImage)); err != nil || !ok {
		t.Fatalf("the holder's image is gone from the store after n1's restart: %v %v", ok, err)
	}
	if !strings.Contains(n1.Log(), "fenced") {
		t.Errorf("n1's log does not say it was fenced")
	}

	// Concurrent wakes through the two other nodes, its holder dead:
	// exactly one move.
	hi := byName[holder.Name]
	var others []*testenv.NetNode
	for i, nd := range c.Nodes {
		if i != hi {
			others = append(others, nd)
		}
	}
	movesBefore := moves(others[0], id) + moves(others[1], id)
	c.Kill(hi)
	waitFor(t, time.Minute, holder.Name+" leaves the cluster", func() (bool, string) {
		ok, names := nodeNames(t, others[0].Client)
		return ok && !strings.Contains(names, holder.Name), names
	})
	var wg sync.WaitGroup
	res := make([]sdk.Sandbox, 2)
	errs := make([]error, 2)
	for i, nd := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = nd.Client.Wake(t.Context(), id)
		}()
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("wake through %s: %v", others[i].Name, errs[i])
		}
	}
	if res[0].Node != res[1].Node || res[0].State != "running" {
		t.Fatalf("concurrent wakes answered %s %s and %s %s", res[0].Node, res[0].State, res[1].Node, res[1].State)
	}
	if m := moves(others[0], id) + moves(others[1], id) - movesBefore; m != 1 {
		t.Fatalf("%d moves for two concurrent wakes, want 1", m)
	}
	if f := shOn(t, others[0], id, "cat /tmp/hello"); f != "moved-file" {
		t.Fatalf("the file after the second move: %q", f)
	}
	t.Logf("two concurrent wakes through %s and %s: one move, to %s", others[0].Name, others[1].Name, res[0].Node)
	c.Restart(hi)

	// A node killed mid-move (after the fetch): nothing half made, and a
	// later wake works. The sandbox sleeps on u; v adopts it (w drained).
	u := c.Nodes[byName[res[0].Node]]
	var v, wn *testenv.NetNode
	for _, nd := range c.Nodes {
		switch {
		case nd == u:
		case v == nil:
			v = nd
		default:
			wn = nd
		}
	}
	sleepWithImage(u, id)
	v.Stop()
	c.RestartEnv(byName[v.Name], []string{"CLADE_CRASH_AT=adopt-after-fetch"})
	if _, err := wn.Client.DrainNode(t.Context(), wn.Name); err != nil {
		t.Fatal(err)
	}
	c.Kill(byName[u.Name])
	waitFor(t, time.Minute, u.Name+" leaves the cluster", func() (bool, string) {
		ok, names := nodeNames(t, wn.Client)
		return ok && !strings.Contains(names, u.Name), names
	})
	if _, err := wn.Client.Wake(t.Context(), id); err == nil {
		t.Fatalf("the wake through %s succeeded: %s did not crash mid-move", wn.Name, v.Name)
	}
	if err := v.Wait(); err == nil {
		t.Fatalf("%s did not die at the crash point", v.Name)
	}
	if !strings.Contains(v.Log(), "adopt-after-fetch") {
		t.Fatalf("%s did not crash at adopt-after-fetch:\n%s", v.Name, v.Log())
	}
	c.Restart(byName[v.Name])
	if d := sleepDirOf(v, id); len(d) != 0 {
		t.Fatalf("%s left %v after its restart", v.Name, d)
	}
	// The record still says moving (to v) until v's census, run as it
	// restarts, finds no live claim and puts it back asleep on v; the list
	// shows the record meanwhile. It never shows it running.
	waitFor(t, time.Minute, v.Name+"'s census puts "+id+" back asleep", func() (bool, string) {
		sbs, err := v.Client.ListSandboxes(t.Context())
		if err != nil {
			return false, err.Error()
		}
		for _, s := range sbs {
			if s.ID == id && s.Node == v.Name {
				if s.State != "sleeping" && s.State != "moving" {
					t.Fatalf("%s lists %s %s after its restart", v.Name, id, s.State)
				}
				return s.State == "sleeping", s.State
			}
		}
		return true, "not listed on " + v.Name
	})
	if _, err := wn.Client.UndrainNode(t.Context(), wn.Name); err != nil {
		t.Fatal(err)
	}
	woke, err := wn.Client.Wake(t.Context(), id)
	if err != nil || woke.State != "running" {
		t.Fatalf("the wake after the crashed move: %+v %v", woke, err)
	}
	if f := shOn(t, wn, id, "cat /tmp/hello"); f != "moved-file" {
		t.Fatalf("the file after the crashed move: %q", f)
	}
	t.Logf("a move killed after its fetch on %s left nothing; the next wake moved it to %s", v.Name, woke.Node)
	c.Restart(byName[u.Name])

	// Its live node refuses the wake for room (a --memory-floor above all
	// memory): a wake through another node moves it to a third, and the
	// refusing node, asked about it, finds it moved and removes its copy.
	h := c.Nodes[byName[woke.Node]]
	sleepWithImage(h, id)
	h.Stop()
	h.SetArgs("--memory-floor", strconv.Itoa(memTotalMiB(t)))
	c.Restart(byName[h.Name])
	var via *testenv.NetNode
	for _, nd := range c.Nodes {
		if nd != h {
			via = nd
			break
		}
	}
	if woke, err = via.Client.Wake(t.Context(), id); err != nil || woke.Node == h.Name || woke.State != "running" {
		t.Fatalf("wake through %s of a sandbox its node %s refuses for room: %+v %v", via.Name, h.Name, woke, err)
	}
	if got, err := h.Client.GetSandbox(t.Context(), id); err != nil || got.Node != woke.Node || got.State != "running" {
		t.Fatalf("get through the refusing %s: %+v %v (want running on %s)", h.Name, got, err, woke.Node)
	}
	if d := sleepDirOf(h, id); len(d) != 0 {
		t.Fatalf("the refusing %s keeps %v after the move", h.Name, d)
	}
	t.Logf("%s refused the wake for room; the wake through %s moved it to %s", h.Name, via.Name, woke.Node)
	h.Stop()
	h.SetArgs("--memory-floor", "0") // the default again
	c.Restart(byName[h.Name])

	// clade node drain moves a sleeping sandbox off (lazily: its record
	// names another node at once, it wakes there), and the latency of a
	// wake on the node that slept it against one on another node (the
	// image fetched from the store).
	var local, cross []time.Duration
	for i := range 5 {
		h = c.Nodes[byName[woke.Node]]
		sleepWithImage(h, id)
		t0 := time.Now()
		if _, err := h.Client.Wake(t.Context(), id); err != nil {
			t.Fatalf("local wake on %s: %v", h.Name, err)
		}
		local = append(local, time.Since(t0))
		before := sleepWithImage(h, id)
		if _, err := h.Client.DrainNode(t.Context(), h.Name); err != nil {
			t.Fatal(err)
		}
		given, _ := record(id)
		if given.Node == h.Name || given.State != "sleeping" || given.Epoch != before.Epoch+1 {
			t.Fatalf("after drain %s: record %+v (before %+v)", h.Name, given, before)
		}
		t0 = time.Now()
		if woke, err = h.Client.Wake(t.Context(), id); err != nil || woke.Node != given.Node || woke.State != "running" {
			t.Fatalf("wake through drained %s: %+v %v (given to %s)", h.Name, woke, err, given.Node)
		}
		cross = append(cross, time.Since(t0))
		if d := sleepDirOf(h, id); len(d) != 0 {
			t.Fatalf("drained %s keeps %v after the move", h.Name, d)
		}
		if i == 0 {
			if f := shOn(t, h, id, "cat /tmp/hello"); f != "moved-file" {
				t.Fatalf("the file after the drain's move: %q", f)
			}
		}
		if _, err := h.Client.UndrainNode(t.Context(), h.Name); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(local)
	slices.Sort(cross)
	t.Logf("wake p50 of %d: on the node that slept it %s, on another node (image from the store) %s; max %s and %s",
		len(local), local[len(local)/2].Round(time.Millisecond), cross[len(cross)/2].Round(time.Millisecond),
		local[len(local)-1].Round(time.Millisecond), cross[len(cross)-1].Round(time.Millisecond))
}
