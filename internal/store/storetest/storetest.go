// Package storetest is the suite every implementation of the store's
// domains (store.All) passes: the SQLite store today, a cluster's
// directory tomorrow. Each case opens a fresh store.
package storetest

import (
	"slices"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// Opener opens a fresh, empty store whose records name node (empty: the
// implementation's default).
type Opener func(t *testing.T, node string) store.All

// Run runs the suite against the stores open makes.
func Run(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Opener)
	}{
		{"sandboxes", testSandboxes},
		{"transitions", testTransitions},
		{"committed memory", testCommitted},
		{"nodes", testNodes},
		{"snapshots", testSnapshots},
		{"pool claim", testPool},
		{"volumes", testVolumes},
		{"secrets", testSecrets},
		{"images", testImages},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open) })
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantClass(t *testing.T, what string, err error, c errdefs.Class) {
	t.Helper()
	if !errdefs.Is(err, c) {
		t.Fatalf("%s: %v, want %s", what, err, c)
	}
}

func sandbox(id, name, state string, mib int) store.Sandbox {
	return store.Sandbox{ID: id, Name: name, Image: "default", State: state, MemoryMiB: mib, CPUs: 1, Env: []string{"A=1"}}
}

func testSandboxes(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	sb := sandbox("0123456789abcdef", "box", store.StateRunning, 256)
	sb.Opts.Labels = map[string]string{"team": "a"}
	must(t, st.InsertSandbox(ctx, sb))
	wantClass(t, "a second sandbox of the same name", st.InsertSandbox(ctx, sandbox("1123456789abcdef", "box", store.StateRunning, 1)), errdefs.AlreadyExists)
	wantClass(t, "a second sandbox of the same id", st.InsertSandbox(ctx, sandbox("0123456789abcdef", "", store.StateRunning, 1)), errdefs.AlreadyExists)
	for _, ref := range []string{"0123456789abcdef", "box"} {
		got, err := st.GetSandbox(ctx, ref)
		must(t, err)
		if got.ID != sb.ID || got.Name != "box" || got.MemoryMiB != 256 || got.Opts.Labels["team"] != "a" || !slices.Equal(got.Env, sb.Env) {
			t.Fatalf("GetSandbox(%s): %+v", ref, got)
		}
		if !st.Taken(ref) {
			t.Fatalf("Taken(%s) = false for a recorded sandbox", ref)
		}
	}
	_, err := st.GetSandbox(ctx, "nobody")
	wantClass(t, "GetSandbox of a missing one", err, errdefs.NotFound)
	wantClass(t, "SetOptions of a missing one", st.SetOptions(ctx, "nobody", store.Options{}), errdefs.NotFound)
	o := store.Options{TimeoutMS: 5000}
	must(t, st.SetOptions(ctx, sb.ID, o))
	if got, _ := st.GetSandbox(ctx, sb.ID); got.Opts.TimeoutMS != 5000 {
		t.Fatalf("options after SetOptions: %+v", got.Opts)
	}
	must(t, st.InsertSandbox(ctx, sandbox("2123456789abcdef", "", store.StateRunning, 1)))
	all, err := st.ListSandboxes(ctx)
	must(t, err)
	if len(all) != 2 || all[0].ID != sb.ID {
		t.Fatalf("ListSandboxes (oldest first): %+v", all)
	}
	must(t, st.DeleteSandbox(ctx, sb.ID))
	must(t, st.DeleteSandbox(ctx, sb.ID)) // again: a missing one is not an error
	if st.Taken("box") {
		t.Fatal("the removed sandbox's name is still taken")
	}
	must(t, st.InsertSandbox(ctx, sandbox("3123456789abcdef", "box", store.StateRunning, 1)))
}

func testTransitions(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	must(t, st.InsertSandbox(ctx, sandbox("a123456789abcdef", "", store.StateCreating, 1)))
	must(t, st.Transition(ctx, "a123456789abcdef", store.StateCreating, store.StateRunning, ""))
	// From a stale state: the compare-and-set fails loudly.
	wantClass(t, "a transition from a stale state", st.Transition(ctx, "a123456789abcdef", store.StateCreating, store.StateSleeping, ""), errdefs.Conflict)
	if got, _ := st.GetSandbox(ctx, "a123456789abcdef"); got.State != store.StateRunning {
		t.Fatalf("state after a refused transition: %s", got.State)
	}
	must(t, st.SetState(ctx, "a123456789abcdef", store.StateStopped, "it died"))
	if got, _ := st.GetSandbox(ctx, "a123456789abcdef"); got.State != store.StateStopped || got.Error != "it died" {
		t.Fatalf("after SetState: %+v", got)
	}
	ids := []string{"b123456789abcdef", "c123456789abcdef"}
	for _, id := range ids {
		must(t, st.InsertSandbox(ctx, sandbox(id, "", store.StateCreating, 1)))
	}
	must(t, st.TransitionAll(ctx, ids, store.StateCreating, store.StateRunning))
	for _, id := range ids {
		if got, _ := st.GetSandbox(ctx, id); got.State != store.StateRunning {
			t.Fatalf("%s after TransitionAll: %s", id, got.State)
		}
	}
	wantClass(t, "a TransitionAll from a stale state", st.TransitionAll(ctx, ids, store.StateCreating, store.StateRunning), errdefs.Conflict)
}

func testCommitted(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	must(t, st.InsertSandbox(ctx, sandbox("a123456789abcdef", "", store.StateRunning, 100)))
	must(t, st.InsertSandbox(ctx, sandbox("b123456789abcdef", "", store.StateCreating, 20)))
	must(t, st.InsertSandbox(ctx, sandbox("c123456789abcdef", "", store.StateSleeping, 300)))
	n, err := st.CommittedMemoryMiB(ctx)
	must(t, err)
	if n != 120 {
		t.Fatalf("committed %d MiB, want 120 (running and creating, not sleeping)", n)
	}
	must(t, st.Transition(ctx, "a123456789abcdef", store.StateRunning, store.StateSuspending, ""))
	must(t, st.Transition(ctx, "a123456789abcdef", store.StateSuspending, store.StateSleeping, ""))
	must(t, st.DeleteSandbox(ctx, "b123456789abcdef"))
	if n, _ := st.CommittedMemoryMiB(ctx); n != 0 {
		t.Fatalf("committed %d MiB after a sleep and a removal, want 0", n)
	}
}

func testNodes(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "node-a")
	if st.Node() != "node-a" {
		t.Fatalf("Node() = %q", st.Node())
	}
	must(t, st.InsertSandbox(ctx, sandbox("a123456789abcdef", "", store.StateRunning, 1)))
	other := sandbox("b123456789abcdef", "", store.StateRunning, 1)
	other.Node = "node-b"
	must(t, st.InsertSandbox(ctx, other))
	must(t, st.InsertSnapshot(ctx, store.Snapshot{ID: "s123456789abcdef", Sandbox: "a123456789abcdef", Image: "default", State: store.SnapshotReady, Path: "/x"}))
	for id, want := range map[string]string{"a123456789abcdef": "node-a", "b123456789abcdef": "node-b"} {
		if got, _ := st.GetSandbox(ctx, id); got.Node != want {
			t.Fatalf("sandbox %s names node %q, want %q", id, got.Node, want)
		}
	}
	if sn, _ := st.GetSnapshot(ctx, "s123456789abcdef"); sn.Node != "node-a" {
		t.Fatalf("snapshot names node %q, want node-a", sn.Node)
	}
	if def := open(t, ""); def.Node() == "" {
		t.Fatal("a store opened without a node names none")
	}
}

func testSnapshots(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	sn := store.Snapshot{ID: "s123456789abcdef", Name: "snap", Sandbox: "a123456789abcdef", Image: "default", State: store.SnapshotCreating, MemoryMiB: 64, CPUs: 1, Path: "/snaps/s1"}
	must(t, st.InsertSnapshot(ctx, sn))
	wantClass(t, "a second snapshot of the same name", st.InsertSnapshot(ctx, store.Snapshot{ID: "s2", Name: "snap", Path: "/p"}), errdefs.AlreadyExists)
	must(t, st.SetSnapshotReady(ctx, sn.ID, 4096))
	must(t, st.SetSnapshotImplicit(ctx, sn.ID))
	got, err := st.GetSnapshot(ctx, "snap")
	must(t, err)
	if got.State != store.SnapshotReady || got.SizeBytes != 4096 || !got.Implicit || got.Path != sn.Path {
		t.Fatalf("GetSnapshot: %+v", got)
	}
	child := sandbox("c123456789abcdef", "", store.StateRunning, 64)
	child.Snapshot = sn.ID
	must(t, st.InsertSandbox(ctx, child))
	users, err := st.SnapshotUsers(ctx, sn.ID)
	must(t, err)
	if !slices.Equal(users, []string{child.ID}) {
		t.Fatalf("SnapshotUsers: %v", users)
	}
	must(t, st.DeleteSnapshot(ctx, sn.ID))
	_, err = st.GetSnapshot(ctx, sn.ID)
	wantClass(t, "GetSnapshot after DeleteSnapshot", err, errdefs.NotFound)
	if l, _ := st.ListSnapshots(ctx); len(l) != 0 {
		t.Fatalf("ListSnapshots after the removal: %+v", l)
	}
}

func testPool(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	must(t, st.AddPoolSandbox(ctx, "p123456789abcdef"))
	must(t, st.AddPoolSandbox(ctx, "q123456789abcdef"))
	marked, err := st.PoolSandboxes(ctx)
	must(t, err)
	if !slices.Equal(marked, []string{"p123456789abcdef", "q123456789abcdef"}) {
		t.Fatalf("PoolSandboxes: %v", marked)
	}
	// A claim records the sandbox and drops its mark at once.
	must(t, st.ClaimPoolSandbox(ctx, sandbox("p123456789abcdef", "claimed", store.StateRunning, 64)))
	if got, err := st.GetSandbox(ctx, "claimed"); err != nil || got.ID != "p123456789abcdef" {
		t.Fatalf("the claimed sandbox: %+v, %v", got, err)
	}
	if marked, _ := st.PoolSandboxes(ctx); !slices.Equal(marked, []string{"q123456789abcdef"}) {
		t.Fatalf("marks after the claim: %v", marked)
	}
	// A claim that fails (a taken name) leaves the mark.
	wantClass(t, "a claim under a taken name", st.ClaimPoolSandbox(ctx, sandbox("q123456789abcdef", "claimed", store.StateRunning, 1)), errdefs.AlreadyExists)
	if marked, _ := st.PoolSandboxes(ctx); !slices.Equal(marked, []string{"q123456789abcdef"}) {
		t.Fatalf("marks after a failed claim: %v", marked)
	}
	must(t, st.RemovePoolSandbox(ctx, "q123456789abcdef"))
	if marked, _ := st.PoolSandboxes(ctx); len(marked) != 0 {
		t.Fatalf("marks after the removal: %v", marked)
	}
}

func testVolumes(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	v := store.Volume{ID: "v123456789abcdef", Name: "data", State: "creating"}
	must(t, st.InsertVolume(ctx, v))
	wantClass(t, "a second volume of the same name", st.InsertVolume(ctx, store.Volume{ID: "w123456789abcdef", Name: "data"}), errdefs.AlreadyExists)
	must(t, st.SetVolumeState(ctx, v.ID, "ready"))
	must(t, st.SetVolumeImported(ctx, v.ID, 1<<20))
	got, err := st.GetVolume(ctx, "data")
	must(t, err)
	if got.ID != v.ID || got.SizeBytes != 1<<20 {
		t.Fatalf("GetVolume: %+v", got)
	}
	must(t, st.DeleteVolume(ctx, v.ID))
	_, err = st.GetVolume(ctx, "data")
	wantClass(t, "GetVolume after DeleteVolume", err, errdefs.NotFound)
}

func testSecrets(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	seal := func(b string) func(int) []byte { return func(int) []byte { return []byte(b) } }
	s1, err := st.PutSecret(ctx, "token", seal("one"))
	must(t, err)
	s2, err := st.PutSecret(ctx, "token", seal("two"))
	must(t, err)
	if s2.Version <= s1.Version {
		t.Fatalf("versions %d then %d: a new value must get a later version", s1.Version, s2.Version)
	}
	for v, want := range map[int]string{s1.Version: "one", s2.Version: "two"} {
		got, err := st.SecretValue(ctx, "token", v)
		must(t, err)
		if string(got) != want {
			t.Fatalf("version %d: %q, want %q", v, got, want)
		}
	}
	must(t, st.PruneSecretVersions(ctx, "token", map[int]bool{s2.Version: true}))
	_, err = st.SecretValue(ctx, "token", s1.Version)
	wantClass(t, "a pruned version", err, errdefs.NotFound)
	must(t, st.DeleteSecret(ctx, "token"))
	_, err = st.GetSecret(ctx, "token")
	wantClass(t, "GetSecret after DeleteSecret", err, errdefs.NotFound)
}

func testImages(t *testing.T, open Opener) {
	ctx := t.Context()
	st := open(t, "")
	img := store.Image{Name: "app", Ref: "127.0.0.1:5000/app:v1", Source: "pull", RootFS: "/images/roots/r1", SizeBytes: 10}
	_, replaced, err := st.PutImage(ctx, img)
	must(t, err)
	if replaced {
		t.Fatal("PutImage of a new name reported a replaced image")
	}
	for _, get := range []func() (store.Image, error){
		func() (store.Image, error) { return st.GetImage(ctx, "app") },
		func() (store.Image, error) { return st.GetImageByRef(ctx, "127.0.0.1:5000/app:v1") },
	} {
		got, err := get()
		must(t, err)
		if got.RootFS != img.RootFS {
			t.Fatalf("image: %+v", got)
		}
	}
	img.RootFS = "/images/roots/r2"
	old, replaced, err := st.PutImage(ctx, img)
	must(t, err)
	if !replaced || old.RootFS != "/images/roots/r1" {
		t.Fatalf("PutImage over a name: old %+v, replaced %v", old, replaced)
	}
	if _, err := st.DeleteImage(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	_, err = st.GetImage(ctx, "app")
	wantClass(t, "GetImage after DeleteImage", err, errdefs.NotFound)
}
