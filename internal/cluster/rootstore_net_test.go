package cluster_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
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

// TestNetClusterWakeRootFromStore: a sandbox on an image only n1 holds
// (the default image: n2 and n3 have image directories of their own, with
// no image) sleeps on n1, which puts the image root in the object store
// beside the sleep image before the record names it; n1 is SIGKILLed, so
// no live node holds the root. With the root's object damaged the wake is
// refused, nothing of the root is left on the nodes, and the sandbox stays
// asleep; with the object whole again the wake moves it to another node,
// which fetches the root from the store: its file is there and its process
// counts on. A forged root object (its own SHA-256 made to match) is
// refused the same way, against the digest the cluster recorded at its
// upload. The damaged object was deleted by the refused wake (logged),
// so that the next sleep on the root puts it back; the test puts it back
// whole. The wake dropped the last image naming the root, so the root's
// object goes too; slept again on its new node (a shipped root), the root
// goes back to the store. The root's upload and the wake from the store are
// logged (docs/benchmarks.md). In S3 (SeaweedFS).
func TestNetClusterWakeRootFromStore(t *testing.T) { wakeRootFromStore(t, "s3") }

// TestNetClusterWakeRootFromDirStore: TestNetClusterWakeRootFromStore's
// scenario with a directory object store that the nodes share (a directory
// the test makes, given to every node as --object-store).
func TestNetClusterWakeRootFromDirStore(t *testing.T) { wakeRootFromStore(t, "dir") }

// rootObjects is the test's view of the store's objects, by key (a
// bucket's key, or a path under the store's directory).
type rootObjects struct {
	has    func(key string) (bool, error)
	get    func(key string) []byte
	put    func(key string, b []byte)
	remove func(key string)
}

func wakeRootFromStore(t *testing.T, kind string) {
	own := []string{testenv.TempDir(t), testenv.TempDir(t)}
	extra := []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}
	perNode := func(i int) []string {
		if i > 0 {
			return []string{"--images-dir", own[i-1]}
		}
		return nil
	}
	var (
		c     *testenv.NetCluster
		store snapstore.Store
		objs  rootObjects
	)
	if kind == "dir" {
		dir := filepath.Join(testenv.TempDir(t), "store")
		c = testenv.StartNetClusterWith(t, 3, extra, perNode, func(netip.Addr) []string { return []string{"--object-store", dir} })
		l, err := snapstore.NewLocal(dir)
		if err != nil {
			t.Fatal(err)
		}
		store, objs = l, dirObjects(t, dir)
	} else {
		var s3cfg snapstore.S3Config
		c, s3cfg = storeCluster(t, 3, "clade-rootstore", extra, perNode)
		s3, err := snapstore.NewS3(t.Context(), s3cfg)
		if err != nil {
			t.Fatal(err)
		}
		store, objs = s3, s3Objects(t, s3cfg)
	}
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	byName := map[string]*testenv.NetNode{"n1": n1, "n2": n2, "n3": n3}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n2.Etcd, n3.Etcd, n1.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	record := func(id string) dirRecord {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var rec dirRecord
		if r, err := cli.Get(ctx, "/clade/sandboxes/"+id); err == nil && len(r.Kvs) == 1 {
			_ = json.Unmarshal(r.Kvs[0].Value, &rec)
		}
		return rec
	}
	exec := func(nd *testenv.NetNode, id, script string) string {
		t.Helper()
		return strings.TrimSpace(sh(t, nd.Client, id, script))
	}
	// hasRoot: the store holds root (its object, read by the test as
	// the bucket's).
	hasRoot := func(root string) (bool, error) {
		return objs.has("roots/sha256-" + strings.TrimPrefix(root, "sha256:") + "/root")
	}
	// rootCopied is the root identity, size and time the node's last
	// "image root copied" line logs.
	rootLine := regexp.MustCompile(`"snapshot store: image root copied".* root=(sha256:[0-9a-f]{64}) size_mib=(\d+) took=(\S+)`)
	rootCopied := func(nd *testenv.NetNode) (string, string, string) {
		all := rootLine.FindAllStringSubmatch(nd.Log(), -1)
		if len(all) == 0 {
			return "", "", ""
		}
		m := all[len(all)-1]
		return m[1], m[2], m[3]
	}
	sleepNamed := func(nd *testenv.NetNode, id string) dirRecord {
		t.Helper()
		t0 := time.Now()
		if _, err := nd.Client.Sleep(t.Context(), id); err != nil {
			t.Fatalf("sleep through %s: %v", nd.Name, err)
		}
		var rec dirRecord
		waitFor(t, 10*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
			rec = record(id)
			if rec.State != "sleeping" || rec.SleepImage == "" {
				return false, fmt.Sprintf("%+v", rec)
			}
			has, err := snapstore.Has(t.Context(), store, snapstore.Digest(rec.SleepImage))
			return has, fmt.Sprintf("%+v in the store: %v %v", rec, has, err)
		})
		t.Logf("slept on %s; the record named its image %s after the sleep call", nd.Name, time.Since(t0).Round(time.Millisecond))
		return rec
	}
	// leftovers is what a refused root fetch must not leave on a node.
	leftovers := func(nd *testenv.NetNode, dir string) []string {
		var found []string
		for _, d := range []string{nd.DataDir, dir} {
			_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
				if err == nil && (strings.HasPrefix(e.Name(), ".build-ship-") || strings.HasPrefix(e.Name(), ".adopt-") ||
					filepath.Base(filepath.Dir(p)) == "shipped-roots" || filepath.Base(filepath.Dir(p)) == ".rootfs") {
					found = append(found, p)
				}
				return nil
			})
		}
		return found
	}

	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	exec(n1, id, `echo root-from-store > /root/f
setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null &
sleep 0.5; test -s /tmp/count`)
	rec := sleepNamed(n1, id)
	// Errors, not fatal, up to the wake: without the root in the store
	// the wake below is the 503 (no live node holds the root).
	root, size, took := rootCopied(n1)
	if root == "" {
		t.Errorf("n1 logs no image root copied to the store; its log:\n%s", tail(n1.Log(), 30))
	} else {
		t.Logf("n1 copied root %s (%s MiB) of image default to the store in %s", root[:19], size, took)
		if has, err := hasRoot(root); !has || err != nil {
			t.Errorf("the record names the sleep image, but the store has its root: %v %v", has, err)
		}
	}
	before, _ := strconv.Atoi(exec(n1, id, "cat /tmp/count")) // a local wake
	if before <= 0 {
		t.Fatalf("count %d before the move", before)
	}
	rec = sleepNamed(n1, id)
	if again, _, _ := rootCopied(n1); len(rootLine.FindAllString(n1.Log(), -1)) != 1 || again != root {
		t.Errorf("the second sleep on the root uploaded it again: %q", rootLine.FindAllString(n1.Log(), -1))
	}

	c.Kill(0)
	waitFor(t, time.Minute, "n1 leaves the cluster", func() (bool, string) {
		ok, names := nodeNames(t, n3.Client)
		return ok && names == "n2,n3", names
	})
	for _, nd := range []*testenv.NetNode{n2, n3} {
		if imgs, err := nd.Client.ListImages(t.Context()); err != nil || len(imgs) != 0 {
			t.Fatalf("%s's images: %+v %v, want none (n1 alone holds the root)", nd.Name, imgs, err)
		}
	}

	// The root's object damaged: one byte flipped in its middle.
	key := "roots/sha256-" + strings.TrimPrefix(root, "sha256:") + "/root"
	var good []byte
	flip := func() {
		t.Helper()
		good = objs.get(key)
		bad := append([]byte(nil), good...)
		bad[len(bad)/2] ^= 0x40
		objs.put(key, bad)
	}
	// refused: a wake with the root's object damaged is a 503, leaves
	// nothing of the root on n2 or n3, and the sandbox stays asleep; the
	// node that read the object deleted it, and logs so.
	refused := func() {
		t.Helper()
		_, err := n2.Client.Wake(t.Context(), id)
		if err == nil || !strings.Contains(err.Error(), "bad image root stream") || !sdk.IsUnavailable(err) {
			t.Fatalf("wake on a damaged root object: %v, want a 503 naming the bad root stream", err)
		}
		t.Logf("refused: %v", err)
		for i, nd := range []*testenv.NetNode{n2, n3} {
			if l := leftovers(nd, own[i]); len(l) != 0 {
				t.Fatalf("the refused root left on %s: %v", nd.Name, l)
			}
		}
		r := record(id)
		if r.State != "sleeping" || r.SleepImage != rec.SleepImage || (r.Node != "n2" && r.Node != "n3") {
			t.Fatalf("the directory's record after the refused wake: %+v (before %+v)", r, rec)
		}
		// Listed asleep through the node it was not given to (a node lists
		// a record given to it only once it adopted it).
		other := n2
		if r.Node == "n2" {
			other = n3
		}
		sbs, err := other.Client.ListSandboxes(t.Context())
		if err != nil || len(sbs) != 1 || sbs[0].ID != id || sbs[0].State != "sleeping" || sbs[0].Node != r.Node {
			t.Fatalf("after the refused wake, through %s: %+v %v, want it sleeping on %s", other.Name, sbs, err, r.Node)
		}
		if has, err := objs.has(key); has || err != nil {
			t.Fatalf("the root's object that did not verify is still in the store: %v %v", has, err)
		}
		logs := n2.Log() + n3.Log()
		for _, line := range []string{`"cluster: the object store's copy of an image root did not verify: deleting it"`, `"snapshot store: image root deleted: it did not verify`} {
			if !strings.Contains(logs, line) {
				t.Fatalf("neither n2 nor n3 logs %s", line)
			}
		}
	}
	if root != "" {
		// Forged: what a writer of the store could make, a byte of a
		// file changed and the stream's own SHA-256 made to match. The
		// wake checks it against the digest the cluster recorded.
		good = objs.get(key)
		objs.put(key, forgeRoot(t, good))
		refused()
		objs.put(key, good) // the test puts it back whole
		flip()
		refused()
		objs.put(key, good)
	}
	// Whole again: the wake fetches the root from the store.
	t0 := time.Now()
	woke, err := n2.Client.Wake(t.Context(), id)
	if err != nil {
		t.Fatalf("wake through n2: %v", err)
	}
	wakeTook := time.Since(t0)
	holder := byName[woke.Node]
	if woke.State != "running" || holder == nil || holder == n1 {
		t.Fatalf("woke %+v, want running on n2 or n3", woke)
	}
	if got := exec(n2, id, "cat /root/f"); got != "root-from-store" {
		t.Fatalf("the woken sandbox's file: %q", got)
	}
	waitFor(t, 30*time.Second, "the count goes on", func() (bool, string) {
		n, _ := strconv.Atoi(exec(holder, id, "cat /tmp/count"))
		return n > before, fmt.Sprintf("%d (before the move: %d)", n, before)
	})
	log := holder.Log()
	if !strings.Contains(log, `"cluster: image root fetched from the object store"`) {
		t.Fatalf("%s does not log a root fetched from the object store", holder.Name)
	}
	shipped := regexp.MustCompile(`"image root shipped here".*`).FindString(log)
	if shipped == "" || len(shippedRoots(t, holder)) != 1 {
		t.Fatalf("%s logs no shipped root (%q) or records %v", holder.Name, shipped, shippedRoots(t, holder))
	}
	t.Logf("woke on %s through n2 in %s, its root from the object store: %s", holder.Name, wakeTook.Round(time.Millisecond), shipped)

	// The wake dropped the sleep image, the last naming the root: the
	// holder notes the root as unneeded, to be deleted after the grace
	// (an hour) if no image names it then.
	note := func() string {
		var found string
		_ = filepath.WalkDir(holder.DataDir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && filepath.Base(filepath.Dir(p)) == "unneeded-roots" && e.Name() == strings.TrimPrefix(root, "sha256:") {
				found = p
			}
			return nil
		})
		return found
	}
	waitFor(t, time.Minute, "the holder notes the root as unneeded", func() (bool, string) {
		return note() != "", "no note"
	})
	if has, err := hasRoot(root); !has || err != nil {
		t.Fatalf("within its grace the root's object is gone: %v %v", has, err)
	}
	// Gone from the store (as a refused wake leaves it), the root is put
	// back from the holder's shipped root when the sandbox sleeps there.
	objs.remove(key)
	last := sleepNamed(holder, id)
	if n := note(); n != "" {
		t.Fatalf("named again, the root is still noted unneeded: %s", n)
	}
	if again, _, took := rootCopied(holder); again != root {
		t.Fatalf("%s did not copy the shipped root %s to the store (%q)", holder.Name, root[:19], again)
	} else {
		t.Logf("%s copied the shipped root back in %s", holder.Name, took)
	}
	if has, err := hasRoot(root); !has || err != nil {
		t.Fatalf("slept on %s, the store has the root: %v %v", holder.Name, has, err)
	}
	if err := n2.Client.DeleteSandbox(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the removed sandbox's image leaves the store", func() (bool, string) {
		has, err := snapstore.Has(t.Context(), store, snapstore.Digest(last.SleepImage))
		return err == nil && !has, fmt.Sprint(has, err)
	})
	waitFor(t, time.Minute, "the holder notes the root as unneeded again", func() (bool, string) {
		return note() != "", "no note"
	})
}

// forgeRoot returns root stream b (image.SendRoot's: a descriptor, frames
// of a tar, a frame of 0, the tar's SHA-256) with one byte of a file in
// its tar changed and its SHA-256 made to match.
func forgeRoot(t *testing.T, b []byte) []byte {
	t.Helper()
	out := append([]byte(nil), b...)
	off := 4 + int(binary.BigEndian.Uint32(out))
	var frames [][]byte // slices of out
	var tarb []byte
	for {
		n := int(binary.BigEndian.Uint32(out[off:]))
		off += 4
		if n == 0 {
			break
		}
		frames = append(frames, out[off:off+n])
		tarb = append(tarb, out[off:off+n]...)
		off += n
	}
	cr := &countReader{r: bytes.NewReader(tarb)}
	tr := tar.NewReader(cr)
	at := -1
	for at < 0 {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no file with content in the root's tar: %v", err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			at = int(cr.n) // archive/tar reads no further than the header
		}
	}
	tarb[at] ^= 1
	for _, f := range frames {
		tarb = tarb[copy(f, tarb):]
	}
	sum := sha256.Sum256(bytes.Join(frames, nil))
	copy(out[off:], sum[:])
	return out
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}

// s3Objects is the bucket's objects, through a plain S3 client.
func s3Objects(t *testing.T, cfg snapstore.S3Config) rootObjects {
	raw := rawStore(t, cfg)
	return rootObjects{
		has: func(key string) (bool, error) {
			_, err := raw.StatObject(t.Context(), cfg.Bucket, key, minio.StatObjectOptions{})
			if minio.ToErrorResponse(err).Code == "NoSuchKey" {
				return false, nil
			}
			return err == nil, err
		},
		get: func(key string) []byte {
			t.Helper()
			obj, err := raw.GetObject(t.Context(), cfg.Bucket, key, minio.GetObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer obj.Close()
			b, err := io.ReadAll(obj)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		put: func(key string, b []byte) {
			t.Helper()
			if _, err := raw.PutObject(t.Context(), cfg.Bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		remove: func(key string) {
			t.Helper()
			if err := raw.RemoveObject(t.Context(), cfg.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// dirObjects is a directory store's objects: its files.
func dirObjects(t *testing.T, dir string) rootObjects {
	return rootObjects{
		has: func(key string) (bool, error) {
			_, err := os.Stat(filepath.Join(dir, key))
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			return err == nil, err
		},
		get: func(key string) []byte {
			t.Helper()
			b, err := os.ReadFile(filepath.Join(dir, key))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		put: func(key string, b []byte) {
			t.Helper()
			// A new file renamed into place, as the store writes it (the
			// old one may be linked elsewhere).
			tmp := filepath.Join(dir, key+".test")
			err := os.WriteFile(tmp, b, 0o600)
			if err == nil {
				err = os.Rename(tmp, filepath.Join(dir, key))
			}
			if err != nil {
				t.Fatal(err)
			}
		},
		remove: func(key string) {
			t.Helper()
			if err := os.Remove(filepath.Join(dir, key)); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// rawStore is a plain S3 client of the store cfg names (the test's view
// of the bucket).
func rawStore(t *testing.T, cfg snapstore.S3Config) *minio.Client {
	t.Helper()
	eu := strings.TrimPrefix(strings.TrimPrefix(cfg.Endpoint, "http://"), "https://")
	raw, err := minio.New(eu, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// dropStoredRoots deletes every image root object in the store cfg
// names, and returns their keys.
func dropStoredRoots(t *testing.T, cfg snapstore.S3Config) []string {
	t.Helper()
	raw := rawStore(t, cfg)
	var keys []string
	for o := range raw.ListObjects(t.Context(), cfg.Bucket, minio.ListObjectsOptions{Prefix: "roots/", Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if strings.HasSuffix(o.Key, "/root") {
			keys = append(keys, o.Key)
			if err := raw.RemoveObject(t.Context(), cfg.Bucket, o.Key, minio.RemoveObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return keys
}
