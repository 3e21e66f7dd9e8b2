package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/api"
)

// TestCandidatesStoreKey: a sleeping sandbox is given only to nodes whose
// object store key is its image's (another host key, no
// --encrypt-at-rest, no store: never); a record an older node wrote (no
// sleep_key) to any; and when the key alone leaves no node, whyStays and
// reassign's words name each node's key and what to do.
func TestCandidatesStoreKey(t *testing.T) {
	mv := &moves{c: &Cluster{cfg: Config{Node: "a", StoreKey: "sealed:aa"}}, pending: &pending{}}
	withKey := func(name, key string) api.Node {
		n := node(name, 8000, 1000, 0, 0)
		n.Capacity.StoreKey = key
		return n
	}
	nodes := []api.Node{withKey("a", "sealed:aa"), withKey("b", "sealed:aa"), withKey("c", "sealed:cc"), withKey("d", "plain"), withKey("e", "")}
	rec := Record{ID: "s1", Node: "a", State: "sleeping", SleepImage: "sha256:00", SleepKey: "sealed:aa", Sandbox: api.Sandbox{Image: "default", MemoryMiB: 256}}
	if got := names(mv.candidates(nodes, rec, "")); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("candidates for an image sealed under a's key: %v, want [b]", got)
	}
	plain := rec
	plain.SleepKey = "plain"
	if got := names(mv.candidates(nodes, plain, "")); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("candidates for a plaintext image: %v, want [d]", got)
	}
	old := rec
	old.SleepKey = ""
	// Placement samples placeK of the nodes each time: every node but a is
	// one, and over many tries each of them comes up.
	seen := map[string]bool{}
	for range 100 {
		got := names(mv.candidates(nodes, old, ""))
		if len(got) < placeK || slices.Contains(got, "a") {
			t.Fatalf("candidates for a record without sleep_key: %v, want %d of b, c, d and e", got, placeK)
		}
		for _, n := range got {
			seen[n] = true
		}
	}
	if len(seen) != 4 {
		t.Fatalf("candidates for a record without sleep_key over 100 tries: %v, want b, c, d and e", seen)
	}
	nodes[1].Draining = true
	if got := names(mv.candidates(nodes, rec, "")); len(got) != 0 {
		t.Fatalf("candidates with b draining: %v, want none", got)
	}
	why := mv.whyStays(nodes, rec)
	for _, s := range []string{"sealed under host key sealed:aa", "node c has host key sealed:cc", "node d has no --encrypt-at-rest", "node e has no --object-store", "--key-file"} {
		if !strings.Contains(why, s) {
			t.Errorf("whyStays = %q, want it to say %q", why, s)
		}
	}
	if strings.Contains(why, "node b has") {
		t.Errorf("whyStays = %q names b, whose key is the image's", why)
	}
}
