package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// encRecord is what the test reads of a directory record in etcd.
type encRecord struct {
	Node       string `json:"node"`
	State      string `json:"state"`
	Epoch      int64  `json:"epoch"`
	SleepImage string `json:"sleep_image"`
	SleepKey   string `json:"sleep_key"`
}

// hostKey writes a new host key file (hex of 32 random bytes, 0600).
func hostKey(t *testing.T, name string) string {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	p := filepath.Join(testenv.TempDir(t), name)
	if err := os.WriteFile(p, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// storeObjects copies every object of the bucket into a fresh dir (one
// file each) and returns the dir and the objects' keys.
func storeObjects(t *testing.T, cfg snapstore.S3Config) (string, []string) {
	t.Helper()
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(testenv.TempDir(t), "objects")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for o := range raw.ListObjects(t.Context(), cfg.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		obj, err := raw.GetObject(t.Context(), cfg.Bucket, o.Key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(len(keys))))
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(f, obj)
		obj.Close()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("read object %s: %v", o.Key, err)
		}
		keys = append(keys, o.Key)
	}
	return dir, keys
}

// TestNetClusterEncryptedMove is sleep and wake anywhere with
// --encrypt-at-rest, on four daemons in network namespaces sharing a real
// S3 store: n1 and n2 have one host key, n3 another, n4 no
// --encrypt-at-rest. A sandbox with a file and a counting process sleeps
// on n1: the store holds only ciphertext (neither the file's content nor
// a marker in the sandbox's memory is in any object, while the scan finds
// the marker in n1's plain view). n1 is SIGKILLed; an exec through n3
// wakes it on n2, the only other node with its key, its file there and
// its process counting on. Asleep on n2 with n2 SIGKILLed and n1
// drained, no live node that may take it has its key: a wake through n3
// (another key) or n4 (plaintext) is refused with an error that says so
// and what to do, and the record stays as it was (asleep on n2, its image
// named, the image in the store). A record given to n3 anyway (a give on
// a stale view) is not claimed by n3, which gives it on once a node with
// the key takes sandboxes again: it wakes there with its file and its
// count. n4's own sandbox sleeps in plaintext and moves to no encrypting
// node; it wakes on n4 again.
func TestNetClusterEncryptedMove(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	keyA, keyB := hostKey(t, "a.key"), hostKey(t, "b.key")
	c, cfg := storeCluster(t, 4, "clade-enc", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, func(i int) []string {
		switch i {
		case 0, 1:
			return []string{"--encrypt-at-rest", "--key-file", keyA}
		case 2:
			return []string{"--encrypt-at-rest", "--key-file", keyB}
		}
		return nil
	})
	n1, n2, n3, n4 := c.Nodes[0], c.Nodes[1], c.Nodes[2], c.Nodes[3]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n2.Etcd, n3.Etcd, n4.Etcd, n1.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	record := func(id string) (encRecord, []byte, int64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		r, err := cli.Get(ctx, "/clade/sandboxes/"+id)
		if err != nil || len(r.Kvs) == 0 {
			t.Fatalf("the record of %s: %v (%d keys)", id, err, len(r.Kvs))
		}
		var rec encRecord
		if err := json.Unmarshal(r.Kvs[0].Value, &rec); err != nil {
			t.Fatal(err)
		}
		return rec, r.Kvs[0].Value, r.Kvs[0].ModRevision
	}
	// sleepWithImage sleeps id through nd and waits for its record to
	// name a copy other than stale's (the last sleep's, until the record
	// is written from the node's events).
	sleepWithImage := func(nd *testenv.NetNode, id, stale string) encRecord {
		t.Helper()
		if _, err := nd.Client.Sleep(t.Context(), id); err != nil {
			t.Fatalf("sleep through %s: %v", nd.Name, err)
		}
		var rec encRecord
		waitFor(t, 2*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
			rec, _, _ = record(id)
			return rec.State == "sleeping" && rec.SleepImage != "" && rec.SleepImage != stale && rec.Node == nd.Name, fmt.Sprintf("%+v", rec)
		})
		return rec
	}
	movedHere := func(nd *testenv.NetNode, id string) int {
		n := 0
		for _, l := range strings.Split(nd.Log(), "\n") {
			if strings.Contains(l, "sleeping sandbox moved here") && strings.Contains(l, id) {
				n++
			}
		}
		return n
	}
	leaves := func(gone *testenv.NetNode, via *testenv.NetNode) {
		t.Helper()
		waitFor(t, time.Minute, gone.Name+" leaves the cluster", func() (bool, string) {
			ok, names := nodeNames(t, via.Client)
			return ok && !strings.Contains(names, gone.Name), names
		})
	}

	// Every node publishes its store key: n1 and n2 the same, n3
	// another, n4 plain.
	keys := map[string]string{}
	waitFor(t, time.Minute, "every node publishes its store key", func() (bool, string) {
		r, err := cli.Get(t.Context(), "/clade/nodes/", clientv3.WithPrefix())
		if err != nil {
			return false, err.Error()
		}
		for _, kv := range r.Kvs {
			var n struct {
				Name     string `json:"name"`
				Capacity struct {
					StoreKey string `json:"store_key"`
				} `json:"capacity"`
			}
			if err := json.Unmarshal(kv.Value, &n); err != nil {
				return false, err.Error()
			}
			keys[n.Name] = n.Capacity.StoreKey
		}
		return len(keys) == 4 && keys["n4"] != "", fmt.Sprint(keys)
	})
	if !strings.HasPrefix(keys["n1"], "sealed:") || keys["n1"] != keys["n2"] || keys["n3"] == keys["n1"] || !strings.HasPrefix(keys["n3"], "sealed:") || keys["n4"] != "plain" {
		t.Fatalf("store keys %v: want n1 = n2 sealed, n3 sealed apart, n4 plain", keys)
	}
	t.Logf("store keys: %v", keys)

	// A sandbox on n1 with a file, a counter and a marker in its memory
	// (put together at run time: only memory holds it whole).
	mem, file := encMarker("mem"), encMarker("file")
	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	half := len(mem) / 2
	sh(t, n1.Client, id, "echo "+file+" > /tmp/f; "+
		"setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null & "+
		"setsid python3 -c 'import sys, time; x = [sys.argv[1] + sys.argv[2] for _ in range(64)]; open(\"/tmp/up\", \"w\").close(); time.sleep(100000)' "+
		mem[:half]+" "+mem[half:]+" >/dev/null 2>&1 </dev/null & until [ -e /tmp/up ] && [ -s /tmp/count ]; do sleep 0.01; done")
	rec := sleepWithImage(n1, id, "")
	if rec.SleepKey != keys["n1"] {
		t.Fatalf("the record's sleep key is %q, n1's store key %q", rec.SleepKey, keys["n1"])
	}

	// What is in the store is ciphertext: the scan that finds nothing
	// there finds the memory marker in n1's plain view of its image.
	markers := []string{mem, file}
	inPlain := testenv.FindMarkers(filepath.Join(n1.DataDir, "plain"), "", markers)
	for _, m := range markers {
		if len(inPlain[m]) == 0 {
			t.Fatalf("n1's plain view does not hold marker %s: the scan cannot tell", m)
		}
	}
	objDir, objKeys := storeObjects(t, cfg)
	if len(objKeys) < 2 {
		t.Fatalf("the store holds %d objects after the sleep: %v", len(objKeys), objKeys)
	}
	for m, where := range testenv.FindMarkers(objDir, "", markers) {
		t.Errorf("marker %s is in plaintext in the object store: %v (keys %v)", m, where, objKeys)
	}
	for _, k := range objKeys {
		// The image roots beside the images are under roots/, their
		// names sealed too (roots/e-HMAC/root, roots/e-HMAC/refs/e-HMAC).
		if name := strings.TrimPrefix(k, "roots/"); !strings.HasPrefix(name, "e-") || strings.Contains(k, strings.TrimPrefix(rec.SleepImage, "sha256:")) {
			t.Errorf("object %s: want every key under e-HMAC/ (or roots/e-HMAC/), none naming the digest", k)
		}
	}
	t.Logf("%d objects, no marker in them (both in n1's plain view: %v)", len(objKeys), inPlain)

	// n1 dies; an exec through n3 (another key) wakes it on n2, the only
	// node with its key.
	before := count(t, n1.Client, id) // wakes it on n1 (a local wake)
	rec = sleepWithImage(n1, id, rec.SleepImage)
	c.Kill(0)
	leaves(n1, n3)
	t0 := time.Now()
	var out strings.Builder
	st, err := n3.Client.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /tmp/f /tmp/count"}, Stdout: &out, Stderr: &out})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec through n3 after n1 died: %v %+v %s", err, st, out.String())
	}
	took := time.Since(t0)
	lines := strings.Fields(out.String())
	if len(lines) != 2 || lines[0] != file {
		t.Fatalf("after the move the sandbox reads %q, want its file %s and a count", out.String(), file)
	}
	if got, _ := strconv.Atoi(lines[1]); got < before {
		t.Fatalf("the count is %s after the move, %d before", lines[1], before)
	}
	moved, _, _ := record(id)
	if moved.Node != "n2" || moved.State != "running" || moved.Epoch <= rec.Epoch {
		t.Fatalf("record after the move: %+v, want running on n2 (the only node with its key) above epoch %d", moved, rec.Epoch)
	}
	if movedHere(n2, id) != 1 || movedHere(n3, id)+movedHere(n4, id) != 0 {
		t.Fatalf("moves logged: n2 %d, n3 %d, n4 %d; want one, on n2", movedHere(n2, id), movedHere(n3, id), movedHere(n4, id))
	}
	was := count(t, n2.Client, id)
	waitFor(t, 30*time.Second, "the count goes on on n2", func() (bool, string) {
		n := count(t, n2.Client, id)
		return n > was, strconv.Itoa(n)
	})
	t.Logf("woken on n2 by an exec through n3 in %s (count %d before)", took.Round(time.Millisecond), before)

	// Asleep on n2, n2 dead, n1 drained: no live node that takes
	// sandboxes has its key. A wake through n3 or n4 is refused, saying
	// so, and the record is left as it was.
	c.Restart(0)
	waitFor(t, time.Minute, "n1 removes its stale copy", func() (bool, string) {
		return strings.Contains(n1.Log(), "fenced"), "n1's log names no fencing"
	})
	asleep := sleepWithImage(n2, id, rec.SleepImage)
	if _, err := n1.Client.DrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	c.Kill(1)
	leaves(n2, n3)
	_, rawBefore, _ := record(id)
	for _, tc := range []struct {
		via  *testenv.NetNode
		says []string
	}{
		{n3, []string{"cannot open its sleep image", "host key " + keys["n3"], "--key-file", "stays asleep"}},
		{n4, []string{"cannot open its sleep image", "node n4 has no --encrypt-at-rest", "--key-file", "stays asleep"}},
	} {
		_, err := tc.via.Client.Wake(t.Context(), id)
		if err == nil {
			t.Fatalf("a wake through %s woke it: no node with its key was there", tc.via.Name)
		}
		var e *sdk.Error
		if !errors.As(err, &e) || e.Status != 503 {
			t.Errorf("wake through %s: %v, want a 503", tc.via.Name, err)
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("wake through %s: %v\nwant it to say %q", tc.via.Name, err, s)
			}
		}
		t.Logf("wake through %s: %v", tc.via.Name, err)
		if rec, raw, _ := record(id); string(raw) != string(rawBefore) {
			t.Fatalf("the record changed under a refused wake through %s: %+v (was %s)", tc.via.Name, rec, rawBefore)
		}
	}
	if movedHere(n3, id)+movedHere(n4, id) != 0 {
		t.Fatalf("n3 or n4 adopted it")
	}
	if _, objKeys := storeObjects(t, cfg); len(objKeys) == 0 {
		t.Fatalf("the store is empty after the refused wakes")
	}

	// A give on a stale view: the record names n3 (as a give by a node
	// that could not tell would). n3 claims nothing; once n1 takes
	// sandboxes again, n3 gives it to n1, where it wakes.
	cur, _, rev := record(id)
	var full map[string]any
	_, raw, _ := record(id)
	if err := json.Unmarshal(raw, &full); err != nil {
		t.Fatal(err)
	}
	full["node"], full["epoch"] = "n3", cur.Epoch+1
	if sbv, ok := full["sandbox"].(map[string]any); ok {
		sbv["node"] = "n3"
	}
	b, _ := json.Marshal(full)
	if r, err := cli.Txn(t.Context()).If(clientv3.Compare(clientv3.ModRevision("/clade/sandboxes/"+id), "=", rev)).
		Then(clientv3.OpPut("/clade/sandboxes/"+id, string(b))).Commit(); err != nil || !r.Succeeded {
		t.Fatalf("give the record to n3: %v", err)
	}
	_, err = n4.Client.Wake(t.Context(), id)
	if err == nil || !strings.Contains(err.Error(), "was given to node n3, which cannot open its sleep image") || !strings.Contains(err.Error(), "--key-file") {
		t.Fatalf("a wake of the record given to n3: %v, want n3's refusal naming its key", err)
	}
	if r, _, _ := record(id); r.Node != "n3" || r.State != "sleeping" || r.SleepImage != asleep.SleepImage {
		t.Fatalf("after n3's refusal the record is %+v, want sleeping on n3 with image %s", r, asleep.SleepImage)
	}
	if _, err := n1.Client.UndrainNode(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "n1 shows undrained", func() (bool, string) {
		ns, err := n4.Client.ListNodes(t.Context())
		if err != nil {
			return false, err.Error()
		}
		for _, n := range ns {
			if n.Name == "n1" {
				return !n.Draining, "draining"
			}
		}
		return false, "n1 not listed"
	})
	woke, err := n3.Client.Wake(t.Context(), id)
	if err != nil || woke.Node != "n1" || woke.State != "running" {
		t.Fatalf("wake through n3 once n1 takes sandboxes: %+v %v, want running on n1", woke, err)
	}
	if got := strings.TrimSpace(sh(t, n3.Client, id, "cat /tmp/f")); got != file {
		t.Fatalf("the file on n1: %q", got)
	}
	was = count(t, n1.Client, id)
	waitFor(t, 30*time.Second, "the count goes on on n1", func() (bool, string) {
		n := count(t, n1.Client, id)
		return n > was, strconv.Itoa(n)
	})
	if movedHere(n3, id)+movedHere(n4, id) != 0 {
		t.Fatalf("n3 or n4 adopted it")
	}
	c.Restart(1)

	// n4's own sandbox sleeps in plaintext (its node's choice) and moves
	// to no encrypting node: with n4 dead a wake through n1 is refused;
	// n4 back, it wakes there.
	psb, err := n4.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n4"})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, n4.Client, psb.ID, "echo plain-"+file+" > /tmp/f")
	prec := sleepWithImage(n4, psb.ID, "")
	if prec.SleepKey != "plain" {
		t.Fatalf("n4's record names sleep key %q, want plain", prec.SleepKey)
	}
	_, objKeys = storeObjects(t, cfg)
	plainKey := "sha256-" + strings.TrimPrefix(prec.SleepImage, "sha256:") + "/m"
	if !slices.Contains(objKeys, plainKey) {
		t.Fatalf("n4's image is not under %s: %v", plainKey, objKeys)
	}
	c.Kill(3)
	leaves(n4, n1)
	_, rawBefore, _ = record(psb.ID)
	_, err = n1.Client.Wake(t.Context(), psb.ID)
	if err == nil || !strings.Contains(err.Error(), "cannot open its sleep image: it is in plaintext") || !strings.Contains(err.Error(), "node n1 has host key "+keys["n1"]) {
		t.Fatalf("wake through n1 of n4's plaintext sandbox, n4 dead: %v", err)
	}
	if _, raw, _ := record(psb.ID); string(raw) != string(rawBefore) {
		t.Fatalf("the record of n4's sandbox changed under a refused wake: %s (was %s)", raw, rawBefore)
	}
	c.Restart(3)
	if woke, err := n1.Client.Wake(t.Context(), psb.ID); err != nil || woke.Node != "n4" {
		t.Fatalf("wake through n1 with n4 back: %+v %v", woke, err)
	}
	if got := strings.TrimSpace(sh(t, n1.Client, psb.ID, "cat /tmp/f")); got != "plain-"+file {
		t.Fatalf("n4's sandbox reads %q", got)
	}
}

// encMarker is a marker no byte of the test's own holds whole.
func encMarker(what string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "clade-enc" + what + "-" + hex.EncodeToString(b)
}
