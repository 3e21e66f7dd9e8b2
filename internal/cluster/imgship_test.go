package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// shippedRoots lists the files naming the image roots shipped to a node
// (DATA/.../shipped-roots/*.json).
func shippedRoots(t *testing.T, nd *testenv.NetNode) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(nd.DataDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(filepath.Dir(p)) == "shipped-roots" {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// removeImages removes, before the cluster stops, every sandbox and image
// name on the nodes at index: the nodes share the machine's image
// directory, where their roots would stay. A node killed by the test is
// started again for it.
func removeImages(t *testing.T, c *testenv.NetCluster, name string, index ...int) {
	ctx := context.Background()
	for _, i := range index {
		if _, err := c.Nodes[i].Client.Health(ctx); err != nil {
			c.Kill(i)
			c.Restart(i)
		}
	}
	for _, nd := range c.Nodes {
		sbs, err := nd.Client.ListSandboxes(ctx)
		if err != nil {
			t.Logf("cleanup: list through %s: %v", nd.Name, err)
			continue
		}
		for _, sb := range sbs {
			if err := nd.Client.DeleteSandbox(ctx, sb.ID); err != nil && !sdk.IsNotFound(err) {
				t.Logf("cleanup: remove %s through %s: %v", sb.ID, nd.Name, err)
			}
		}
	}
	for _, i := range index {
		nd := c.Nodes[i]
		waitFor(t, time.Minute, "image "+name+" removed from "+nd.Name, func() (bool, string) {
			err := nd.Client.DeleteImage(ctx, name)
			return err == nil || sdk.IsNotFound(err), fmt.Sprint(err)
		})
	}
}

// TestNetClusterForkShipsRoot: the image of a fork's parent is on its
// node only, or another build of its name is elsewhere: n1 and n2 each
// build their own "shipme" (n2's differs), n3 has an image directory of
// its own with no image at all. A spread fork of a sandbox of n1's shipme
// places children on n2 and n3 too, which fetch n1's root by its identity
// (verified) and restore on it: each child sees n1's build and the
// parent's file. n2's own shipme stays its own (a create there sees n2's
// build); n3 lists no image. Once the children are removed, the roots
// shipped to n2 and n3 are collected. n3 SIGKILLed mid-fetch of the root
// leaves a build directory its restart removes, and no root.
func TestNetClusterForkShipsRoot(t *testing.T) {
	ownImages := testenv.TempDir(t)
	c := testenv.StartNetCluster(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, func(i int) []string {
		if i == 2 {
			return []string{"--images-dir", ownImages}
		}
		return nil
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	// Removed while the daemons run (cleanups run last first), so that
	// n1's and n2's builds leave no root in the shared image directory.
	t.Cleanup(func() { removeImages(t, c, "shipme", 0, 1) })
	var wg sync.WaitGroup
	for _, nd := range []*testenv.NetNode{n1, n2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if _, err := nd.Client.Build(t.Context(), sdk.BuildRequest{Name: "shipme", From: "default",
				Run: []string{"echo built-on-" + nd.Name + " > /etc/shipme"}}); err != nil {
				t.Errorf("build shipme on %s: %v", nd.Name, err)
			}
			t.Logf("build on %s: %v", nd.Name, time.Since(start))
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if imgs, err := n3.Client.ListImages(t.Context()); err != nil || len(imgs) != 0 {
		t.Fatalf("n3's images: %+v %v, want none", imgs, err)
	}

	parent, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", Image: "shipme", MemoryMiB: 256})
	if err != nil || parent.Node != "n1" {
		t.Fatalf("create on n1: %+v %v", parent, err)
	}
	sh(t, n1.Client, parent.ID, "echo parent-file > /root/f")
	start := time.Now()
	res, err := n3.Client.Fork(t.Context(), parent.ID, 6, sdk.Spread())
	if err != nil {
		t.Fatalf("fork 6 spread through n3: %v", err)
	}
	t.Logf("fork of 6 across 3 nodes, roots shipped to two: %v", time.Since(start))
	on := map[string]int{}
	for i, ch := range res.Children {
		if ch.Error != "" || ch.ID == "" {
			t.Fatalf("child %d: %+v", i, ch)
		}
		on[ch.Node]++
		via := c.Nodes[(i+1)%3].Client
		if got := sh(t, via, ch.ID, "cat /etc/shipme /root/f"); got != "built-on-n1\nparent-file\n" {
			t.Fatalf("child %s on %s: %q", ch.ID, ch.Node, got)
		}
	}
	t.Logf("children by node: %v", on)
	if on["n2"] == 0 || on["n3"] == 0 {
		t.Fatalf("children by node %v: want some on n2 and n3", on)
	}
	for _, nd := range []*testenv.NetNode{n2, n3} {
		m := regexp.MustCompile(`"image root shipped here".*`).FindString(nd.Log())
		if m == "" {
			t.Fatalf("%s logs no shipped root", nd.Name)
		}
		t.Logf("%s: %s", nd.Name, m)
		if got := shippedRoots(t, nd); len(got) != 1 {
			t.Fatalf("%s records shipped roots %v, want one", nd.Name, got)
		}
	}
	// n2's own image of the name is as it was; n3 has no image.
	own, err := n2.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n2", Image: "shipme", MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(t, n2.Client, own.ID, "cat /etc/shipme"); got != "built-on-n2\n" {
		t.Fatalf("a sandbox of n2's own shipme sees %q", got)
	}
	if err := n2.Client.DeleteSandbox(t.Context(), own.ID); err != nil {
		t.Fatal(err)
	}
	if imgs, err := n3.Client.ListImages(t.Context()); err != nil || len(imgs) != 0 {
		t.Fatalf("n3's images after the fork: %+v %v, want none", imgs, err)
	}
	// A second fork: the roots are there, nothing is fetched again.
	res2, err := n1.Client.Fork(t.Context(), parent.ID, 6, sdk.Spread())
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range res2.Children {
		if ch.Error != "" {
			t.Fatalf("second fork's child: %+v", ch)
		}
	}
	for _, nd := range []*testenv.NetNode{n2, n3} {
		if k := strings.Count(nd.Log(), `"image root shipped here"`); k != 1 {
			t.Fatalf("%s shipped %d roots, want 1", nd.Name, k)
		}
	}
	for _, ch := range append(res.Children, res2.Children...) {
		if err := n1.Client.DeleteSandbox(t.Context(), ch.ID); err != nil {
			t.Fatalf("remove %s: %v", ch.ID, err)
		}
	}
	for _, nd := range []*testenv.NetNode{n2, n3} {
		waitFor(t, time.Minute, nd.Name+"'s shipped root collected", func() (bool, string) {
			got := shippedRoots(t, nd)
			return len(got) == 0, fmt.Sprint(got)
		})
	}
	ents, err := os.ReadDir(filepath.Join(ownImages, ".rootfs"))
	if err != nil || len(ents) != 0 {
		t.Fatalf("n3's image directory keeps roots %v (%v)", ents, err)
	}

	// n3 SIGKILLed midway through the root's fetch: its children fail, it
	// leaves a build directory, and restarted it holds no part of it.
	forkThroughCrash(t, c, parent.ID, "ship-root-mid-fetch")
	builds := func() []string {
		m, _ := filepath.Glob(filepath.Join(ownImages, ".build-*"))
		return m
	}
	if len(builds()) == 0 {
		t.Fatal("n3 crashed mid-fetch but left no build directory: the crash point is not mid-fetch")
	}
	c.Kill(2)
	c.Restart(2)
	if b := builds(); len(b) != 0 {
		t.Fatalf("restarted n3 keeps %v", b)
	}
	if ents, err := os.ReadDir(filepath.Join(ownImages, ".rootfs")); err != nil || len(ents) != 0 {
		t.Fatalf("restarted n3 keeps roots %v (%v)", ents, err)
	}
	if got := shippedRoots(t, n3); len(got) != 0 {
		t.Fatalf("restarted n3 records shipped roots %v", got)
	}
	if sbs, err := n3.Client.ListSandboxes(t.Context()); err == nil {
		for _, sb := range sbs {
			if sb.Node == "n3" {
				t.Errorf("restarted n3 holds %s (%s)", sb.ID, sb.State)
			}
		}
	}
}

// ociArchive writes a `docker save` archive of an image made of one layer:
// the default image's root without the bulk a shell does not need, so
// that nodes that import it agree on its root's identity (its digests).
func ociArchive(t *testing.T) string {
	t.Helper()
	dir := testenv.TempDir(t)
	layer := filepath.Join(dir, "layer.tar")
	f, err := os.Create(layer)
	if err != nil {
		t.Fatal(err)
	}
	skip := func(rel string) bool {
		for _, p := range []string{"usr/share", "usr/lib/python3", "usr/lib/python3.11", "var/lib/apt", "var/cache", "var/log"} {
			if rel == p {
				return true
			}
		}
		return false
	}
	err = tarx.CreateFiltered(f, filepath.Join(testenv.ImagesDir(t), "default", "rootfs"), ".", skip)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("shipoci:v1")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "shipoci.tar")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNetClusterWakeShipsRoot: a sandbox of an imported image sleeps on
// n1 (n1 and n2 imported the image, so they hold the same root by its
// digests; n3 has an image directory of its own and no image), n1 is
// SIGKILLed and n2 drained, so its wake goes to n3. With the image removed
// from n2 no live node holds the root: the wake is refused with a clear
// error and the sandbox stays asleep. With the image imported on n2 again,
// the wake through n2 moves it to n3, which fetches the root from n2 (its
// old node is dead): the sandbox runs there on that root with its file.
func TestNetClusterWakeShipsRoot(t *testing.T) {
	archive := ociArchive(t)
	ownImages := testenv.TempDir(t)
	c, s3cfg := storeCluster(t, 3, "clade-imgship", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, func(i int) []string {
		if i == 2 {
			return []string{"--images-dir", ownImages}
		}
		return nil
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	t.Cleanup(func() { removeImages(t, c, "shipoci", 0, 1) })
	importOn := func(nd *testenv.NetNode) {
		t.Helper()
		f, err := os.Open(archive)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := nd.Client.ImportImage(t.Context(), f, sdk.ImportImageRequest{Name: "shipoci"}, nil); err != nil {
			t.Fatalf("import on %s: %v", nd.Name, err)
		}
	}
	importOn(n1)
	importOn(n2)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n2.Etcd, n3.Etcd, n1.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s3, err := snapstore.NewS3(t.Context(), s3cfg)
	if err != nil {
		t.Fatal(err)
	}
	record := func(id string) dirRecord {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var rec dirRecord
		if r, err := cli.Get(ctx, "/clade/sandboxes/"+id); err == nil && len(r.Kvs) == 1 {
			_ = json.Unmarshal(r.Kvs[0].Value, &rec)
		}
		return rec
	}

	sb, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", Image: "shipoci", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sh(t, n1.Client, id, "echo slept-file > /root/f")
	if _, err := n1.Client.Sleep(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the record names the sleep image's copy", func() (bool, string) {
		rec := record(id)
		if rec.State != "sleeping" || rec.SleepImage == "" {
			return false, fmt.Sprintf("%+v", rec)
		}
		has, err := snapstore.Has(t.Context(), s3, snapstore.Digest(rec.SleepImage))
		return has, fmt.Sprintf("%+v in the store: %v %v", rec, has, err)
	})
	if _, err := n2.Client.DrainNode(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	c.Kill(0)
	waitFor(t, time.Minute, "n1 leaves the cluster", func() (bool, string) {
		ok, names := nodeNames(t, n3.Client)
		return ok && names == "n2,n3", names
	})

	// No live node holds the root, and the store's copy of it (n1 put it
	// there with the sleep image) is gone: refused, still asleep.
	if err := n2.Client.DeleteImage(t.Context(), "shipoci"); err != nil {
		t.Fatal(err)
	}
	if keys := dropStoredRoots(t, s3cfg); len(keys) != 1 {
		t.Fatalf("image roots in the store: %v, want the one n1 put", keys)
	}
	_, err = n2.Client.Wake(t.Context(), id)
	if err == nil || !strings.Contains(err.Error(), "no live node holds image root") {
		t.Fatalf("wake with no node holding the root: %v", err)
	}
	t.Logf("refused: %v", err)
	// Any call on it tries the move again (and says why it fails); the
	// list and the directory show it asleep.
	sbs, err := n2.Client.ListSandboxes(t.Context())
	if err != nil || len(sbs) != 1 || sbs[0].ID != id || sbs[0].State != "sleeping" {
		t.Fatalf("after the refused wake: %+v %v, want it sleeping", sbs, err)
	}
	if rec := record(id); rec.State != "sleeping" || rec.SleepImage == "" {
		t.Fatalf("the directory's record after the refused wake: %+v", rec)
	}

	// n2 holds the root again (the same digests): the wake moves the
	// sandbox to n3, which fetches the root from n2.
	importOn(n2)
	t0 := time.Now()
	woke, err := n2.Client.Wake(t.Context(), id)
	if err != nil {
		t.Fatalf("wake through n2: %v", err)
	}
	t.Logf("woke on %s in %v (the root shipped from n2)", woke.Node, time.Since(t0))
	if woke.Node != "n3" || woke.State != "running" {
		t.Fatalf("woke %+v, want running on n3", woke)
	}
	if got := sh(t, n3.Client, id, "cat /root/f"); got != "slept-file\n" {
		t.Fatalf("the woken sandbox's file: %q", got)
	}
	m := regexp.MustCompile(`"image root shipped here".*`).FindString(n3.Log())
	if m == "" || len(shippedRoots(t, n3)) != 1 {
		t.Fatalf("n3 logs no shipped root (%q) or records %v", m, shippedRoots(t, n3))
	}
	t.Logf("n3: %s", m)
	if imgs, err := n3.Client.ListImages(t.Context()); err != nil || len(imgs) != 0 {
		t.Fatalf("n3's images: %+v %v, want none", imgs, err)
	}
	if err := n3.Client.DeleteSandbox(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "n3's shipped root collected", func() (bool, string) {
		got := shippedRoots(t, n3)
		return len(got) == 0, fmt.Sprint(got)
	})
}
