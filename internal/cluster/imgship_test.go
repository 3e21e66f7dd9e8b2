package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestNetClusterForkShipsRoot: the image of a fork's parent is on its
// node only, or another build of its name is elsewhere: n1 and n2 each
// build their own "shipme" (n2's differs), n3 has an image directory of
// its own with no image at all. A spread fork of a sandbox of n1's shipme
// places children on n2 and n3 too, which fetch n1's root by its identity
// (verified) and restore on it: each child sees n1's build and the
// parent's file. n2's own shipme stays its own (a create there sees n2's
// build); n3 lists no image. Once the children are removed, the roots
// shipped to n2 and n3 are collected.
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
	t.Cleanup(func() {
		for _, nd := range c.Nodes {
			if sbs, err := nd.Client.ListSandboxes(t.Context()); err == nil {
				for _, sb := range sbs {
					_ = nd.Client.DeleteSandbox(t.Context(), sb.ID)
				}
			}
		}
		_ = n1.Client.DeleteImage(t.Context(), "shipme")
		_ = n2.Client.DeleteImage(t.Context(), "shipme")
	})
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
}
