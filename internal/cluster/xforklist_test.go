package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestNetClusterForkImporting: a fork's children are listed while their
// node imports them (`importing`, on that node). n3's imports are held (CLADE_TEST_IMPORT_HOLD) after
// they picked their children's ids: a list through another node, and
// through n3, shows n3's children `importing` on n3 while the fork is
// under way, and a get of one answers its record. Released, the fork
// answers those very ids, running, and no importing record is left; each
// imported child's record was written at most twice (importing, then
// running). A `clade rm` of one of n3's children through n1 while it is
// imported waits for the import (it answered a retryable 503 before) and
// removes it once made: the rm answers nil, the fork names the child made
// (it was), and no node then has it or its record. A second fork held the
// same way with n3 SIGKILLed mid-import, a child's rm waiting meanwhile:
// the fork names n3's children failed, the census removes their
// importing records once n3's lease lapses, and the rm then answers nil
// (the child is not there, as asked).
func TestNetClusterForkImporting(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, []string{"--pressure-floor", "-1", "--cluster-lease-ttl", leaseTTL}, nil)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	hold := filepath.Join(testenv.TempDir(t), "hold-imports")
	holdOn := func() {
		if err := os.WriteFile(hold, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	holdOn()
	// Released before the cluster's cleanup (which removes what is left).
	t.Cleanup(func() { _ = os.Remove(hold) })
	c.Kill(2)
	c.RestartEnv(2, []string{"CLADE_TEST_IMPORT_HOLD=" + hold})
	w := countWrites(t, n1.Etcd)
	parent, err := n1.Client.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Node: "n1", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	type forked struct {
		res sdk.ForkResult
		err error
	}
	fork := func() chan forked {
		ch := make(chan forked, 1)
		go func() {
			res, err := n2.Client.Fork(t.Context(), parent.ID, 6, sdk.Spread())
			ch <- forked{res, err}
		}()
		return ch
	}
	importing := func(via *sdk.Client) []string {
		sbs, err := via.ListSandboxes(t.Context())
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var ids []string
		for _, sb := range sbs {
			// (n2's imports are listed too while they last: not held.)
			if sb.State == "importing" && sb.Node == "n3" {
				ids = append(ids, sb.ID)
			}
		}
		slices.Sort(ids)
		return ids
	}
	awaitImporting := func() []string {
		var ids []string
		waitFor(t, 3*time.Minute, "n3's children listed importing through n1", func() (bool, string) {
			ids = importing(n1.Client)
			return len(ids) > 0, fmt.Sprintf("importing: %v", ids)
		})
		return ids
	}

	// rm of an importing child, through a node that does not import it.
	rm := func(id string) chan error {
		ch := make(chan error, 1)
		go func() { ch <- n1.Client.DeleteSandbox(t.Context(), id) }()
		return ch
	}
	done := fork()
	ids := awaitImporting()
	t.Logf("while n3 imports, the list through n1 shows its children %v importing", ids)
	removed := rm(ids[0])
	if got := importing(n3.Client); !slices.Equal(got, ids) {
		t.Fatalf("through n3 (which imports them): importing %v, through n1 %v", got, ids)
	}
	if sb, err := n2.Client.GetSandbox(t.Context(), ids[0]); err != nil || sb.State != "importing" || sb.Node != "n3" {
		t.Fatalf("get %s through n2 while importing: %+v %v", ids[0], sb, err)
	}
	select {
	case f := <-done:
		t.Fatalf("the fork answered while n3's import is held: %+v %v", f.res, f.err)
	default:
	}
	select {
	case err := <-removed:
		t.Fatalf("the rm of importing child %s answered while n3's import is held: %v (want: it waits for the import)", ids[0], err)
	default:
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	var f forked
	select {
	case f = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the fork did not answer within 5 minutes of the import's release")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	select {
	case err := <-removed:
		if err != nil {
			t.Fatalf("rm of %s, imported meanwhile: %v", ids[0], err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the rm of %s did not answer within a minute of the fork's answer", ids[0])
	}
	t.Logf("the rm of %s, issued while it was imported, answered once the import was done", ids[0])
	for _, via := range []*sdk.Client{n1.Client, n3.Client} {
		if sb, err := via.GetSandbox(t.Context(), ids[0]); !sdk.IsNotFound(err) {
			t.Fatalf("get %s after its rm: %+v %v, want not found", ids[0], sb, err)
		}
	}
	if sbs, err := n3.Client.ListSandboxes(t.Context()); err != nil {
		t.Fatal(err)
	} else {
		for _, sb := range sbs {
			if sb.ID == ids[0] {
				t.Fatalf("n3 lists %s after its rm: %+v", ids[0], sb)
			}
		}
	}
	var onN3 []string
	for _, ch := range f.res.Children {
		if ch.Error != "" {
			t.Fatalf("child: %+v", ch)
		}
		if ch.Node == "n3" {
			onN3 = append(onN3, ch.ID)
		}
	}
	slices.Sort(onN3)
	if !slices.Equal(onN3, ids) {
		t.Fatalf("the fork made %v on n3; the list showed %v importing", onN3, ids)
	}
	if left := importing(n1.Client); len(left) != 0 {
		t.Fatalf("after the fork, still importing: %v", left)
	}
	for _, id := range ids[1:] {
		if sb, err := n1.Client.GetSandbox(t.Context(), id); err != nil || sb.State != "running" || sb.Node != "n3" {
			t.Fatalf("child %s after the fork: %+v %v", id, sb, err)
		}
	}
	w.settle()
	for _, id := range ids[1:] {
		if got := len(w.of("/clade/sandboxes/" + id)); got > 2 {
			t.Errorf("%d etcd writes of imported child %s's record, want at most 2 (importing, running)", got, id)
		}
	}

	// n3 killed mid-import: the census removes its children's records.
	holdOn()
	done = fork()
	ids = awaitImporting()
	removed = rm(ids[0])
	c.Kill(2)
	select {
	case f = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the fork did not answer within 5 minutes of n3's SIGKILL")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	for _, ch := range f.res.Children {
		if ch.Node == "n3" && ch.Error == "" {
			t.Fatalf("a child made on n3, killed mid-import: %+v", ch)
		}
	}
	waitFor(t, 2*time.Minute, "the importing records of killed n3 removed", func() (bool, string) {
		left := importing(n1.Client)
		return len(left) == 0, fmt.Sprintf("importing: %v (were %v)", left, ids)
	})
	for _, id := range ids {
		if _, err := n1.Client.GetSandbox(t.Context(), id); !sdk.IsNotFound(err) {
			t.Fatalf("get %s, an importing child of killed n3, after the census: %v, want not found", id, err)
		}
	}
	select {
	case err := <-removed:
		if err != nil {
			t.Fatalf("rm of %s, whose importer was killed: %v", ids[0], err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the rm of %s did not answer within a minute of the census", ids[0])
	}
}
